"""The tooling's own refusal: a value given to a command, a sheet, a plan request or a hardware
profile file broke a rule, and the message names the field and the rule. The engine's configs
refuse theirs with engine/config.py's `ConfigError`; a command that turns either into a message or
an `infeasible` record catches `REFUSED`, both."""

from __future__ import annotations

from zerobench.engine.config import ConfigError


class InputError(ValueError):
    """A value given to the tooling broke a rule; the message names the field."""


REFUSED = (ConfigError, InputError)
