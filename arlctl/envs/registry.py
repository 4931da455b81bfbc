"""Registries of environments and reward functions, by name: `--env math`, `--reward math`.

A name resolves in this order:
1. built in: registered by the module that defines it. Names in PROVIDERS are imported on first use, so
   `make_env("swe")` works without this module importing the swe code (and its sandbox dependencies)
   when only math is wanted;
2. a member of a family: `--env textarena:Wordle-v0` names one of many envs a provider module makes on demand
   (FAMILIES: family -> module); importing the module registers the family, which registers the member;
3. a `module:attribute` spec (any other name with a ':'), imported as is: `--env mypkg.env:make`;
4. a Python entry point in the group `arlctl.envs` / `arlctl.rewards`, loaded on first use. A plugin
   name that collides with a built-in one never replaces it (built-in wins; `arlctl envs` says so).
Every failure to load out-of-tree code is a UsageError naming the spec or the distribution.

An env maker is any callable returning an object with async reset/step/close; `make_env` calls it once.
A run asks for an `env_factory(name, **options)` instead: it hands out full arlctl.envs.base.Env objects
(`as_env` fills in what a plugin leaves out), one per trajectory, and `await factory.aclose()` at the end
releases what its envs shared (swe: the sandbox pools; nothing for math, first-token and plugins).
A reward function has the shape
    score(final_state, task, response_text) -> (reward, components, info)
and a version string that the reward stage writes into `reward_version`. A score function may carry
`version_suffix(**options) -> str` (appended to that version: e.g. a rubric file's content hash),
`unversioned_options` (option names left out of the version: how it runs, not what it gives) and, for
rewards that compare the members of a GRPO group, `score_group` (see stages/reward.py). A plugin reward's version is
the `version` / `VERSION` attribute of the function or else its module, else "<module>:<attribute>".
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Any

from arlctl.envs.base import Env, EnvFactory, as_env, missing_methods
from arlctl.errors import UsageError, did_you_mean

EnvMaker = Callable[..., Any]  # options -> an env object (a class, or a plugin's function)
ScoreFn = Callable[..., tuple[float, dict[str, float], dict[str, Any]]]
ENV_GROUP = "arlctl.envs"
REWARD_GROUP = "arlctl.rewards"


@dataclass(frozen=True)
class Reward:
    name: str
    version: str  # written to reward_version; includes non-default options so runs stay distinguishable
    score: ScoreFn


@dataclass(frozen=True)
class Source:
    """Where a registered name comes from, as `arlctl envs` shows it."""

    kind: str  # "builtin", "entry-point" or "spec"
    module: str  # the Python module (builtin), or "module:attr" (entry point, spec)
    distribution: str | None = None  # entry points: the installed distribution that declares it
    distribution_version: str | None = None


ENVS: dict[str, EnvMaker] = {}
ENV_VERSIONS: dict[str, str] = {}  # built-in name -> its env version, for `arlctl envs`
# Built-in names whose envs share something across a run: name -> maker of its EnvFactory(**options).
SHARED_FACTORIES: dict[str, Callable[..., EnvFactory]] = {}
REWARDS: dict[str, tuple[ScoreFn, str]] = {}  # name -> (score function, base version)
SOURCES: dict[tuple[str, str], Source] = {}  # (what, name) -> source of plugins loaded in this process
# Modules that register an env, its reward and its builtin task source when imported (on first use).
PROVIDERS = {"swe": "arlctl.envs.swe", "first-token": "arlctl.envs.toy", "two-first-tokens": "arlctl.envs.toy",
             "reasoning-gym": "arlctl.envs.reasoning_gym", "code": "arlctl.envs.code"}
# Rewards with no env of their name (model-based rewards): name -> module that registers it.
REWARD_PROVIDERS = {"judge": "arlctl.rewards.judge", "genrm": "arlctl.rewards.genrm", "format": "arlctl.rewards.format"}
# Built-in envs whose trajectories hold a sandbox while they run (swe: one container each; code: a bwrap
# sandbox from a shared pool per python-tool call): what `arlctl plan` sizes sandbox pools for. The other
# built-ins (math, the toys, reasoning-gym, textarena) hold none.
SANDBOXED_ENVS = frozenset({"swe", "code"})
# Families of envs named `FAMILY:MEMBER`: family -> module whose import calls register_family.
FAMILIES = {"textarena": "arlctl.envs.textarena"}
# family -> function(member) that registers the env (and its reward) named "FAMILY:MEMBER", or raises UsageError
FAMILY_MEMBERS: dict[str, Callable[[str], None]] = {}
_PLUGIN_TABLES = {"env": (ENVS, ENV_GROUP), "reward": (REWARDS, REWARD_GROUP)}


def register_env(name: str, make: EnvMaker, *, version: str | None = None,
                 factory: Callable[..., EnvFactory] | None = None) -> None:
    """Register an env maker; `factory` when a run's envs share something (it makes the EnvFactory)."""
    ENVS[name] = make
    if version is not None:
        ENV_VERSIONS[name] = version
    if factory is not None:
        SHARED_FACTORIES[name] = factory


def register_reward(name: str, score: ScoreFn, version: str) -> None:
    REWARDS[name] = (score, version)


def register_family(family: str, register_member: Callable[[str], None]) -> None:
    """Make `FAMILY:MEMBER` names resolve: register_member(MEMBER) registers that env (and its reward)."""
    FAMILY_MEMBERS[family] = register_member


def family_of(name: str) -> str | None:
    """The family a `FAMILY:MEMBER` name belongs to, or None (a plain name or a module:attr spec)."""
    family, colon, member = name.partition(":")
    return family if colon and member and family in FAMILIES else None


def import_provider(name: str, table: dict[str, Any], what: str) -> None:
    """Import the module that registers `name` into `table`, if it is not there yet."""
    family = family_of(name)
    if family is not None and name not in table:
        if family not in FAMILY_MEMBERS:
            try:
                importlib.import_module(FAMILIES[family])
            except ImportError as exc:
                raise UsageError(f"{what} {name!r} is not available: {exc}",
                                 hint=f"install the {family} package into this environment") from None
        FAMILY_MEMBERS[family](name.partition(":")[2])
        return
    module = PROVIDERS.get(name) or (REWARD_PROVIDERS.get(name) if table is REWARDS else None)
    if name not in table and module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"{what} {name!r} is not available: {exc}") from None


def uses_sandbox(name: str) -> bool | None:
    """Whether trajectories of env `name` hold a sandbox: True or False for a built-in (or a family member),
    None for a plugin or an unknown name (its code is not loaded to find out)."""
    if name in SANDBOXED_ENVS:
        return True
    if name in builtin_names("env") or family_of(name) is not None:
        return False
    return None


def is_spec(name: str) -> bool:
    """A `module:attribute` plugin spec (a family member such as textarena:Wordle-v0 is not one)."""
    return ":" in name and family_of(name) is None


def builtin_names(what: str) -> set[str]:
    """Names built into arlctl, whether or not their module is imported yet."""
    table, _ = _PLUGIN_TABLES[what]
    providers = set(PROVIDERS) | (set(REWARD_PROVIDERS) if what == "reward" else set())
    return {name for name in set(table) | providers if (what, name) not in SOURCES and family_of(name) is None}


def _ensure(name: str, table: dict[str, Any], what: str) -> None:
    import_provider(name, table, what)
    if name in table:
        return
    if is_spec(name):
        _load_plugin(name, load_spec(name, what), Source("spec", name), what)
        return
    points = entry_points(_PLUGIN_TABLES[what][1]).get(name, [])
    if not points:
        known = sorted(builtin_names(what) | set(entry_points(_PLUGIN_TABLES[what][1])))
        families = [f"{family}:NAME" for family in sorted(FAMILIES)]
        guess = did_you_mean(name, known)
        raise UsageError(f"unknown {what} {name!r}", hint=(f"{guess} " if guess else "") +
                         f"known: {', '.join(known + families)}, or a module:attribute spec (`arlctl envs` lists them)")
    if len(points) > 1:  # two plugins claim one name: refuse rather than pick one silently
        owners = ", ".join(f"{dist} {version} ({point.value})" for point, dist, version in points)
        raise UsageError(f"{what} {name!r} is registered by several plugins: {owners}",
                         hint="pass the one you mean as a module:attribute spec")
    point, dist, version = points[0]
    _load_plugin(name, _load_entry_point(point, dist, version, what), Source("entry-point", point.value, dist, version),
                 what)


def _load_plugin(name: str, obj: Any, source: Source, what: str) -> None:
    if what == "env":
        register_env(name, obj)
    else:
        register_reward(name, obj, plugin_reward_version(obj, source.module))
    SOURCES[(what, name)] = source


def load_spec(spec: str, what: str) -> Callable[..., Any]:
    """The callable a `package.module:attribute` spec names (the attribute may be dotted)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{what} spec {spec!r} must look like package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"{what} {spec!r}: no module named {exc.name!r}",
                         hint="install the package into this environment or fix the spec") from None
    except Exception as exc:  # the plugin's own import-time code failed: its error, one line
        raise UsageError(f"{what} {spec!r}: importing {module_name} failed: {_one_line(exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{what} {spec!r}: module {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{what} {spec!r} is a {type(obj).__name__}, not callable",
                         hint="an env spec names a factory (a class or function); a reward spec a score function")
    return obj


def entry_points(group: str) -> dict[str, list[tuple[metadata.EntryPoint, str, str]]]:
    """Installed plugins of one group: name -> [(entry point, distribution, version)], not loaded."""
    found: dict[str, list[tuple[metadata.EntryPoint, str, str]]] = {}
    for point in metadata.entry_points(group=group):
        dist = point.dist.metadata["Name"] if point.dist is not None else "?"
        version = point.dist.version if point.dist is not None else "?"
        claims = found.setdefault(point.name, [])
        if all((p.value, d) != (point.value, dist) for p, d, _ in claims):  # one dist seen twice on sys.path
            claims.append((point, dist, version))
    return {name: sorted(claims, key=lambda claim: claim[1]) for name, claims in found.items()}  # stable messages


def _load_entry_point(point: metadata.EntryPoint, dist: str, version: str, what: str) -> Callable[..., Any]:
    try:
        obj = point.load()
    except Exception as exc:  # a broken plugin is the plugin's fault: name it, never a traceback
        raise UsageError(f"{what} {point.name!r} from plugin {dist} {version} ({point.value}) failed to load: "
                         f"{_one_line(exc)}", hint=f"fix or reinstall {dist}, or `pip uninstall {dist}`") from None
    if not callable(obj):
        raise UsageError(f"{what} {point.name!r} from plugin {dist} {version} ({point.value}) is a "
                         f"{type(obj).__name__}, not callable")
    return obj


def plugin_reward_version(score: Any, spec: str) -> str:
    """`version`/`VERSION` of the function, else of its module, else the spec itself."""
    module = inspect.getmodule(score)
    for owner in (score, module):
        for attr in ("version", "VERSION"):
            value = getattr(owner, attr, None)
            # Only plain values: a module that did `from importlib.metadata import version` has a function there.
            if _plain_version(value):
                return str(value)
    return spec


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def make_env(name: str, **options: Any) -> Any:
    """A fresh environment instance; options go to its constructor (e.g. on_no_action="end").

    A built-in env is a full Env; a plugin's object comes back as it is (checked for reset/step/close), so
    callers that still probe its optional members see them as the plugin wrote them. `env_factory` (what
    a run uses) hands out full Envs: as_env(make_env(...)).
    """
    _ensure(name, ENVS, "env")
    try:
        env = ENVS[name](**options)
    except TypeError as exc:
        raise UsageError(f"bad option for env {name!r}: {exc}") from None
    missing = missing_methods(env)
    if missing:  # e.g. a spec naming the wrong function: say so now, not as an AttributeError per row
        raise UsageError(f"env {name!r} made a {type(env).__name__} without {', '.join(missing)}",
                         hint="an env factory returns an object with async reset, step and close (docs/environments.md)")
    return env


def resolve_env(name: str) -> EnvMaker:
    """The maker a name resolves to, loading plugins; a UsageError for an unknown or broken name."""
    _ensure(name, ENVS, "env")
    return ENVS[name]


class PlainEnvFactory:
    """The EnvFactory of an env whose instances share nothing: each call is `make_env(name, **options)`."""

    def __init__(self, name: str, options: dict[str, Any]):
        self.name, self.options = name, dict(options)

    def __call__(self) -> Env:
        # make_env looked up per call: a maker that fails per trajectory is an env_error row, not a crash
        return as_env(make_env(self.name, **self.options))

    async def aclose(self) -> None:
        return None


def env_factory(name: str, **options: Any) -> EnvFactory:
    """The factory of one run's `name` envs (options checked now): call it per trajectory, aclose() at the end."""
    _ensure(name, ENVS, "env")
    if name in SHARED_FACTORIES:
        try:
            return SHARED_FACTORIES[name](**options)
        except TypeError as exc:
            raise UsageError(f"bad option for env {name!r}: {exc}") from None
    _check_options(name, ENVS[name], options)
    return PlainEnvFactory(name, options)


def _check_options(name: str, make: EnvMaker, options: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(make)
    except (TypeError, ValueError):  # no signature to check (a C callable): the first env will tell
        return
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise UsageError(f"bad option for env {name!r}: {exc}") from None


def get_reward(name: str, **options: Any) -> Reward:
    """The named reward function with options bound (e.g. format_weight=0.1 for math)."""
    _ensure(name, REWARDS, "reward")
    score, version = REWARDS[name]
    try:  # fail now, with the cause, rather than on the first row
        signature = inspect.signature(score)
    except ValueError:  # no signature to check (a C function): the first row will tell
        signature = None
    if signature is not None:
        try:
            signature.bind(None, {}, "")
        except TypeError as exc:
            raise UsageError(f"reward {name!r} cannot be called as score(final_state, task, response_text): {exc}",
                             hint="--reward names a score function (docs/environments.md: the reward protocol)") from None
        try:
            signature.bind(None, {}, "", **options)
        except TypeError as exc:
            raise UsageError(f"bad option for reward {name!r}: {exc}") from None
    # Options that change how a reward runs but not what it gives (a judge's concurrency, timeout, retries
    # and endpoint URL: the model itself is in its version_suffix) stay out of the version, so a re-run
    # with other ones still hits the reward cache.
    unversioned = set(getattr(score, "unversioned_options", ()))
    versioned = sorted(key for key in options if key not in unversioned)
    if versioned:
        version += "+" + ",".join(f"{key}={options[key]}" for key in versioned)
    if options:
        score = partial(score, **options)
    # A reward whose options name content (a rubric file, a judge model) says what that content is, so a
    # changed rubric behind the same path is another version (and misses the reward cache).
    describe = getattr(REWARDS[name][0], "version_suffix", None)
    if callable(describe):
        version += describe(**options)
    return Reward(name=name, version=version, score=score)


def list_envs() -> list[str]:
    return sorted(set(ENVS) | set(PROVIDERS) | {f"{family}:GAME" for family in FAMILIES})


def catalog(what: str) -> list[dict[str, Any]]:
    """Every name `--env` (what="env") or `--reward` ("reward") accepts, with where it comes from.

    Built-in providers are imported (to show their module); plugins are listed from their metadata and
    not loaded, so one broken plugin cannot hide the others.
    """
    table, group = _PLUGIN_TABLES[what]
    entries: list[dict[str, Any]] = []
    for name in sorted(builtin_names(what)):
        entry: dict[str, Any] = {"name": name, "source": "builtin"}
        try:
            import_provider(name, table, what)
        except UsageError as exc:
            entry.update(module=PROVIDERS.get(name) or REWARD_PROVIDERS.get(name), error=str(exc))
        if name in table:
            obj = table[name][0] if what == "reward" else table[name]
            entry["module"] = obj.__module__
            entry["version"] = table[name][1] if what == "reward" else ENV_VERSIONS.get(name)
        entries.append(entry)
    for family, module in sorted(FAMILIES.items()):  # one line per family: its members are made on demand
        entries.append({"name": f"{family}:GAME", "source": "builtin", "module": module,
                        "note": f"a family: --{what} {family}:<member>"})
    builtins = builtin_names(what)
    for name, claims in sorted(entry_points(group).items()):
        for point, dist, version in claims:
            entry = {"name": name, "source": "entry-point", "module": point.value, "distribution": dist,
                     "distribution_version": version}
            if name in builtins:
                entry["note"] = "shadowed: the built-in of the same name wins"
            elif len(claims) > 1:
                entry["note"] = "ambiguous: several plugins claim this name; use a module:attribute spec"
            entries.append(entry)
    for (kind, name), source in sorted(SOURCES.items()):
        if kind == what and source.kind == "spec":  # specs loaded in this process
            entries.append({"name": name, "source": "spec", "module": source.module})
    return entries


def _plain_version(value: Any) -> str | None:
    return str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else None


def _register_builtin() -> None:
    from arlctl.envs import math as math_env

    register_env(math_env.ENV_NAME, math_env.MathEnv, version=math_env.ENV_VERSION)
    register_reward(math_env.ENV_NAME, math_env.score, math_env.REWARD_VERSION)


_register_builtin()
