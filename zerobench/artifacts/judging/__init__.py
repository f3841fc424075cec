"""How a row of a table is judged: its role (judged, fitted, projection), its error band, a
slow host's runs flagged, and a choice made on it read undone."""
