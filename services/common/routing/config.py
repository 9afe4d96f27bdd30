"""Load a scheduler config (YAML or dict) into named profiles.

Shape::

    default_profile: default
    plugins:                       # named plugin instances
      - name: prefix               # unique
        type: approx-prefix        # a registered type (see REGISTRY)
        params: {ttl_s: 600}       # validated; unknown keys are errors
    profiles:
      default:
        description: "..."
        prefill_profile: prefill   # optional: P/D (run this over prefill-role endpoints)
        plugins:
          - prefix                 # bare reference (scorer weight 1)
          - {ref: cost, weight: 3} # weight only for scorers, > 0

Each referenced instance takes every role it implements (preparer, filter, scorer, picker,
decider, post-pick). A profile has at most one picker (default max-score) and one decider.
Every problem raises :class:`ConfigError` with one message naming where it is.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

import services.common.routing.plugins  # noqa: F401  (registers the built-in types)
from services.common.routing.framework import (
    Decider,
    Filter,
    MaxScorePicker,
    Picker,
    PostPick,
    Preparer,
    Profile,
    Scheduler,
    Scorer,
)
from services.common.routing.registry import REGISTRY, PluginEnv

DEFAULT_PROFILES_PATH = Path(__file__).resolve().parent / "default_profiles.yaml"


class ConfigError(ValueError):
    """A scheduler config is invalid; the message says where and why."""


def _fmt_validation(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(params)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _as_mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(v).__name__}")
    return v


def build_plugins(raw: Any, env: PluginEnv) -> dict[str, object]:
    if not isinstance(raw, list):
        raise ConfigError("plugins: expected a list of {name, type, params}")
    out: dict[str, object] = {}
    for i, item in enumerate(raw):
        m = _as_mapping(item, f"plugins[{i}]")
        extra = set(m) - {"name", "type", "params"}
        if extra:
            raise ConfigError(f"plugins[{i}]: unknown key(s) {sorted(extra)}")
        name, type_name = m.get("name"), m.get("type")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"plugins[{i}]: 'name' must be a non-empty string")
        if name in out:
            raise ConfigError(f"plugins[{i}]: duplicate plugin name {name!r}")
        if not isinstance(type_name, str) or type_name not in REGISTRY:
            known = ", ".join(sorted(REGISTRY))
            raise ConfigError(f"plugin {name!r}: unknown type {type_name!r} (known: {known})")
        spec = REGISTRY[type_name]
        params_raw = m.get("params") or {}
        _as_mapping(params_raw, f"plugin {name!r} params")
        try:
            params = spec.params.model_validate(params_raw)
            out[name] = spec.factory(name, params, env)
        except ValidationError as e:
            raise ConfigError(
                f"plugin {name!r} ({type_name}): bad params: {_fmt_validation(e)}"
            ) from None
        except (ValueError, KeyError) as e:
            raise ConfigError(f"plugin {name!r} ({type_name}): {e}") from None
    return out


def _build_profile(pname: str, raw: Any, plugins: Mapping[str, object]) -> Profile:
    m = _as_mapping(raw, f"profile {pname!r}")
    extra = set(m) - {"plugins", "prefill_profile", "description"}
    if extra:
        raise ConfigError(f"profile {pname!r}: unknown key(s) {sorted(extra)}")
    refs = m.get("plugins")
    if not isinstance(refs, list) or not refs:
        raise ConfigError(f"profile {pname!r}: 'plugins' must be a non-empty list")
    preparers: list[Preparer] = []
    filters: list[Filter] = []
    scorers: list[tuple[Scorer, float]] = []
    pickers: list[Picker] = []
    deciders: list[Decider] = []
    post: list[PostPick] = []
    seen: set[str] = set()
    for j, ref in enumerate(refs):
        weight: Any = None
        name: Any
        if isinstance(ref, str):
            name = ref
        else:
            r = _as_mapping(ref, f"profile {pname!r} plugins[{j}]")
            bad = set(r) - {"ref", "weight"}
            if bad:
                raise ConfigError(f"profile {pname!r} plugins[{j}]: unknown key(s) {sorted(bad)}")
            name, weight = r.get("ref"), r.get("weight")
        if not isinstance(name, str) or name not in plugins:
            raise ConfigError(f"profile {pname!r}: reference to undefined plugin {name!r}")
        if name in seen:
            raise ConfigError(f"profile {pname!r}: plugin {name!r} referenced twice")
        seen.add(name)
        p = plugins[name]
        if weight is not None and not isinstance(p, Scorer):
            raise ConfigError(f"profile {pname!r}: plugin {name!r} is not a scorer; no weight")
        if isinstance(p, Scorer):
            if weight is None:
                weight = 1.0
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise ConfigError(
                    f"profile {pname!r}: weight of {name!r} must be a number > 0, got {weight!r}"
                )
            scorers.append((p, float(weight)))
        if isinstance(p, Preparer):
            preparers.append(p)
        if isinstance(p, Filter):
            filters.append(p)
        if isinstance(p, Picker):
            pickers.append(p)
        if isinstance(p, Decider):
            deciders.append(p)
        if isinstance(p, PostPick):
            post.append(p)
    if len(pickers) > 1:
        names = [x.name for x in pickers]
        raise ConfigError(f"profile {pname!r}: more than one picker {names}")
    if len(deciders) > 1:
        raise ConfigError(f"profile {pname!r}: more than one P/D decider")
    pf = m.get("prefill_profile")
    if pf is not None and not isinstance(pf, str):
        raise ConfigError(f"profile {pname!r}: prefill_profile must be a profile name")
    preparers.sort(key=lambda x: int(getattr(x, "phase", 0)))
    return Profile(
        name=pname,
        preparers=tuple(preparers),
        filters=tuple(filters),
        scorers=tuple(scorers),
        picker=pickers[0] if pickers else MaxScorePicker(),
        decider=deciders[0] if deciders else None,
        prefill_profile=pf,
        post_pick=tuple(post),
        description=str(m.get("description", "")),
    )


def load_config(
    raw: Mapping[str, Any] | str | Path,
    *,
    env: PluginEnv | None = None,
    rng: random.Random | None = None,
) -> Scheduler:
    """Build a :class:`Scheduler` from a mapping, a YAML string or a YAML file path.

    Raises :class:`ConfigError` for any invalid config (including YAML syntax)."""
    if isinstance(raw, Path):
        try:
            raw = raw.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read scheduler config: {e}") from None
    if isinstance(raw, str):
        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"scheduler config is not valid YAML: {e}") from None
    doc = _as_mapping(raw, "scheduler config")
    extra = set(doc) - {"plugins", "profiles", "default_profile"}
    if extra:
        raise ConfigError(f"scheduler config: unknown key(s) {sorted(extra)}")
    plugins = build_plugins(doc.get("plugins", []), env or PluginEnv())
    praw = _as_mapping(doc.get("profiles"), "profiles")
    if not praw:
        raise ConfigError("profiles: at least one profile is required")
    profiles = {str(k): _build_profile(str(k), v, plugins) for k, v in praw.items()}
    for p in profiles.values():
        if p.prefill_profile is not None:
            if p.prefill_profile not in profiles:
                raise ConfigError(
                    f"profile {p.name!r}: prefill_profile {p.prefill_profile!r} is not defined"
                )
            if profiles[p.prefill_profile].prefill_profile is not None:
                raise ConfigError(
                    f"profile {p.name!r}: prefill profile {p.prefill_profile!r} "
                    "must not itself name a prefill_profile"
                )
    default = doc.get("default_profile", "default")
    if not isinstance(default, str) or default not in profiles:
        raise ConfigError(f"default_profile {default!r} is not a defined profile")
    return Scheduler(
        profiles,
        default,
        rng or random.Random(0),
        decode_can_prefill=(env or PluginEnv()).decode_can_prefill,
    )


def load_default(env: PluginEnv | None = None, rng: random.Random | None = None) -> Scheduler:
    """The shipped profiles (``services/common/routing/default_profiles.yaml``)."""
    return load_config(DEFAULT_PROFILES_PATH, env=env, rng=rng)
