"""The paper's claims, each read from the tables into one ledger with its verdict."""
