"""The paper's tables and figures from records, in rooms by concern: `tables/` builds each
artifact's table (the registry names every artifact's builder and figure), `plots/` draws its
figure, `judging/` says how a row is judged (its role, its band, its host's speed), `claims/` reads
the paper's claims from the tables, and `report/` writes results/REPORT.md. No torch import."""
