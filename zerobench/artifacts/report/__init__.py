"""results/REPORT.md: every artifact's section with its verdict, the H200 section, the held-out
bands and the plan's checks."""
