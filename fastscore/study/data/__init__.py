"""The study's data layer: the items (items.py), the environments that build them from the data sets and judge an
action (envs/), the harness conditions that render an item's contexts (conditions.py), the stored score row
(score_row.py), the description hygiene (hygiene.py), the data folder (datafile.py) and the token caps (caps.py)."""
