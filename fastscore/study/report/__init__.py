"""The study's report layer: report.md (document.py) from its sections (control.py, label.py, prior.py,
sensitivity.py) over the markdown cells and tables, the HTML report (html*.py), the plots (plots.py) and the
README's results table (readme_table.py)."""
