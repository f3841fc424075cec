"""Each artifact's table from its records (results/<artifact>.csv): the registry, the builders,
and the paper's performance artifacts predicted in one process (`in_process`)."""
