"""The measurements `fastscore bench` runs (throughput, scale); `lab/` holds the investigations, scripts the package
never imports."""
