"""Sheets of trials: a workflow sheet expanded into trials with their ids and flags (`sheets`),
the paper's "largest that fits" policy for micro-batch and depth (`search`), and many modelled
trials predicted in one process (`modelled`). Pure Python below the torch line: the workflow
imports it at parse time."""
