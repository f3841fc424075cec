"""Sheets -> trials: a workflow sheet expanded into trials with their ids and flags (`sheets`), a
sheet's modelled groups predicted in one process (`groups`, each trial's record from
zerobench/sources/modelled.py), and an interleaved measured group (`interleave`). Pure Python below
the torch line: the workflow imports it at parse time."""
