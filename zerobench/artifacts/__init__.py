"""The paper's tables and figures from records: each artifact's table (`tables`, with the builders
in `paper_tables`, `table1`, `capacity`, `superlinear`, `vs_measured`), the paper-scale tables
from the performance model in one process (`modelled`), the figures (`plots/`) and
results/REPORT.md (`report`). No torch import."""
