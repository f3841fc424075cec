"""A sheet of trials (workflows/config/sheets/<artifact>.yaml): its groups expanded into trials,
each trial's id and its `zerobench run|trace|model` flags. Pure Python and YAML: the workflow
imports it at parse time, so dry runs stay light.

A group is `source` (measured, traced or modelled) with `base` fields, optional `cases` (a list
of field mappings, each laid over `base`: points that differ in several fields at once, like the
paper's per-size runs) and an optional `grid` (field -> values, the cartesian product over each
case). Unknown fields fail here, naming the field, before any trial runs.

A measured group with `interleave: R` runs as one job (zerobench/sweeps/interleave.py): its trials
in R rounds, each trial once per round as `repeat` r, the order reversed every other round. Points
that a table compares (N_d 1 against 2) are then timed seconds apart, in every round, so a slow
spell of the host falls on both; the table compares each round's points with each other.
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import yaml

from zerobench.trial.errors import InputError
from zerobench.trial.fields import COMMAND, FIELDS, SHEET_FIELDS, SOURCES, resolved, takes

SHEET_DIR = Path(__file__).resolve().parents[2] / "workflows" / "config" / "sheets"
SCHEMA = SHEET_DIR.parents[1] / "schemas" / "sheet.schema.yaml"
GROUP_KEYS = ("source", "base", "cases", "grid", "smoke", "interleave")


def _check_fields(fields, where: str) -> None:
    if not isinstance(fields, dict):
        raise InputError(f"{where}: must be a mapping of trial fields, got {fields!r}")
    unknown = [k for k in fields if k not in SHEET_FIELDS]
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}; trial fields are {sorted(SHEET_FIELDS)}")


def check_sheet(sheet: dict, name: str) -> None:
    """Refuse unknown group keys and trial fields, naming them (the JSON schema in
    workflows/schemas/sheet.schema.yaml says the same for Snakemake)."""
    for i, group in enumerate(sheet.get("trials") or []):
        where = f"sheet {name}, group {i}"
        unknown = [k for k in group if k not in GROUP_KEYS]
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r}; a group has {list(GROUP_KEYS)}")
        if group.get("source") not in SOURCES:
            raise InputError(f"{where}: source={group.get('source')!r}; choose one of {list(SOURCES)}")
        _check_fields(group.get("base", {}), f"{where}, base")
        _check_fields(group.get("grid", {}), f"{where}, grid")
        for j, case in enumerate(group.get("cases") or []):
            _check_fields(case, f"{where}, case {j}")
        _check_interleave(group, where)
        smoke = group.get("smoke")
        if isinstance(smoke, dict):
            for part in ("base", "grid"):
                _check_fields(smoke.get(part, {}), f"{where}, smoke {part}")


def _check_interleave(group: dict, where: str) -> None:
    rounds = group.get("interleave")
    if rounds is None:
        return
    if group["source"] != "measured":
        raise InputError(f"{where}: interleave={rounds!r} times measured trials; this group is {group['source']}")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 2:
        raise InputError(f"{where}: interleave={rounds!r}; give the number of rounds, 2 or more")
    parts = [group.get("base", {}), group.get("grid", {}), *(group.get("cases") or [])]
    if any("repeat" in part for part in parts):
        raise InputError(f"{where}: interleave sets each trial's repeat (its round); drop the repeat field")


def load_sheet(name_or_path: str | Path) -> dict:
    """A sheet by artifact name (from SHEET_DIR) or path, checked."""
    path = Path(name_or_path)
    if path.suffix != ".yaml":
        path = SHEET_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise InputError(f"sheet={str(name_or_path)!r}: no sheet at {path}")
    with open(path) as f:
        sheet = yaml.safe_load(f)
    check_sheet(sheet, path.stem)
    return sheet


def expand_group(group: dict, smoke: bool = False) -> list[dict]:
    """The trials of one group: each case over the base, times the grid (smoke overrides applied),
    each named value resolved (`bucket_mb: paper`, zerobench/trial/fields.py)."""
    base, grid = dict(group.get("base", {})), dict(group.get("grid", {}))
    override = group.get("smoke", {})
    if smoke and override is False:
        return []
    if smoke:
        for key, value in override.get("base", {}).items():
            base[key] = value
            grid.pop(key, None)
        for key, values in override.get("grid", {}).items():
            grid[key] = values
            base.pop(key, None)
    trials = []
    for case in group.get("cases") or [{}]:
        for combo in product(*grid.values()):
            values = {**base, **case, **dict(zip(grid, combo, strict=True))}
            trials.append(dict(source=group["source"], **resolved(values)))
    rounds = group.get("interleave")
    if rounds:  # the order they run in: forward, back, forward..., so a steady drift weighs on each alike
        return [dict(t, repeat=r) for r in range(1, rounds + 1) for t in (trials if r % 2 else trials[::-1])]
    return trials


def trial_id(trial: dict) -> str:
    """A readable, unique name: the source, then each set field as its tag + value, in the
    fields' order (zerobench/trial/fields.py)."""
    parts = []
    for name in SHEET_FIELDS:
        tag, value = FIELDS[name].tag, trial.get(name)
        if tag is None or value is None or value is False:
            continue
        if value is True:
            parts.append(tag)
        else:
            parts.append(f"{tag}{Path(str(value)).stem if name == 'data' else value}")
    return f"{trial['source']}_" + "-".join(parts)


def trial_flags(trial: dict) -> list[str]:
    """The trial's command-line flags for its source's command, the fields that command takes
    (world size from the sheet, never from resources; `--gpus` sets dp = gpus / mp, and a layout
    where that fails is infeasible). A measured trial runs on whatever the cluster has, so it
    takes no hardware profile."""
    command = COMMAND[trial["source"]]
    flags = []
    for name in SHEET_FIELDS:
        value = trial.get(name)
        if value is None or value is False or not takes(command, name):
            continue
        flags += [FIELDS[name].option] if value is True else [FIELDS[name].option, str(value)]
    return flags


def schema_fields() -> dict:
    """The sheet schema's trial fields (`$defs.fields`) and their names, made from the table."""
    properties = {name: FIELDS[name].json_schema() for name in SHEET_FIELDS}
    return {"properties": properties, "names": list(SHEET_FIELDS)}


def write_schema(path: Path = SCHEMA) -> None:
    """Rewrite the sheet schema's trial fields from the table (after a field is added there)."""
    with open(path) as f:
        schema = yaml.safe_load(f)
    made = schema_fields()
    schema["$defs"]["fields"]["properties"] = made["properties"]
    schema["$defs"]["fieldnames"]["enum"] = made["names"]
    with open(path, "w") as f:
        f.write(
            "# $defs.fields and fieldnames: made from zerobench/trial/fields.py by python -m zerobench.sweeps.sheets\n"
        )
        yaml.safe_dump(schema, f, sort_keys=False, width=120, allow_unicode=True)


def world_size(trial: dict) -> int:
    return trial.get("gpus") or trial.get("dp", 1) * trial.get("mp", 1)


def launch_prefix(trial: dict, launcher: str) -> list[str]:
    """What starts a trial's ranks: `<launcher> -n <world>` (e.g. srun, one task per rank) for a
    multi-rank trial; nothing for one rank, or with no launcher (zerobench starts its own ranks)."""
    world = world_size(trial)
    return [launcher, "-n", str(world)] if launcher and world > 1 else []


def sheet_trials(sheet: dict, smoke: bool = False) -> list[list[dict]]:
    """Per group, its trials (an empty list for a group dropped from smoke runs)."""
    return [expand_group(group, smoke) for group in sheet.get("trials") or []]


def trials_by_id(sheet: dict) -> dict[str, dict]:
    """Every trial of the sheet, at full and smoke scale, by id: the table joins records to them."""
    return {trial_id(t): t for smoke in (False, True) for group in sheet_trials(sheet, smoke) for t in group}


if __name__ == "__main__":  # python -m zerobench.sweeps.sheets: rewrite the schema's trial fields
    write_schema()
