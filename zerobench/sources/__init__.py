"""Where a record's numbers come from, one module per source, each with one `record(values, ...)`
from a trial's field values (parsed flags, or a sheet's trial): `measured` (real steps of the engine,
under the run's batch/depth policy, time limit and slow-spell rerun), `traced` (the engine under
FakeTensorMode), `emulated` (one rank of any world on one device, its collectives priced by the
model) and `modelled` (the performance model); `infeasible`, the record of a layout that cannot
exist. The command line (zerobench/cli.py) parses flags into values and calls these; the sweeps
(zerobench/sweeps/) turn sheets into trials and call them too."""
