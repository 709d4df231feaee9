"""ninelives in your own pytest suite: a fixture and a marker that check an engine's
crash-safety, failing the test with the verdict table, the witnesses, the situations
reached and the command that replays the failure.

    def test_my_engine_survives_crashes(ninelives):
        ninelives.sim("smoke", engine="myproject.adapter:ENGINE", seeds="1..20")

    @pytest.mark.ninelives("lost-lease", engine="myproject.adapter:ENGINE")
    def test_no_zombie_writes():
        pass

`ninelives.sim` simulates seeds in one process, `ninelives.run` runs real processes,
`ninelives.explore` searches within a time budget (chaos.testing.suite_checks does the work). A
failing seed is remembered in the database folder (`.ninelives/` under the rootdir,
chaos.testing.remembered) and tried first next time, as Hypothesis replays its failing examples; it
is forgotten once it has passed three times in a row.

Settings, each a command-line option over an ini key over a default; an argument given in
the test itself wins over all three:

    --ninelives-seeds N|A..B      ninelives_seeds        seeds simulated (default 1..10)
    --ninelives-profile P         ninelives_profile      smoke, ci or soak (default ci)
    --ninelives-budget T          ninelives_budget       explore's budget (default 30s)
    --ninelives-engine SPEC       ninelives_engine       the adapter (default reference)
    --ninelives-require-exercised ninelives_require_exercised
    --ninelives-shrink K          ninelives_shrink       shrink a failing sim (default 0: off)
    --ninelives-shard I/N         ninelives_shard        one CI job's share of the seeds
    --ninelives-database DIR      ninelives_database     (default .ninelives; none: off)

Installed with the package as the `ninelives` pytest11 entry point; `-p no:ninelives` turns
it off. Loading it imports pytest and the standard library only: the harness (and
Hypothesis) are imported by the first check a test runs.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import pytest

#: (option suffix, metavar, ini default, help) of every setting; its ini key is
#: ninelives_<suffix>.
SETTINGS = (
    ("seeds", "N|A..B", "1..10",
     "the seeds a simulated check runs: N (1..N) or A..B (default 1..10); a real run takes "
     "the first of them unless the test names its seeds"),
    ("profile", "P", "ci", "the scenario profile: smoke, ci or soak (default ci)"),
    ("budget", "T", "30s",
     "how long an exploration searches: seconds, or with s/m/h (default 30s)"),
    ("engine", "SPEC", "reference",
     "the engine adapter of a check that names none: reference, module:object or a file "
     "(default reference)"),
    ("shrink", "K", "0",
     "simulations spent shrinking a failing simulated seed to a minimal schedule (default "
     "0: no shrink; the failure prints the command)"),
    ("shard", "I/N", "",
     "run only shard I of N of every check's seeds, split as `ninelives sim --shard I/N` "
     "splits them, and explore only that shard's seeds (default: all seeds)"),
    ("database", "DIR", ".ninelives",
     "the folder of remembered failing seeds and explore corpora, relative to the rootdir "
     "(default .ninelives; 'none': off)"),
)
REQUIRE_HELP = ("fail a check whose invariants passed without reaching any of the dangerous "
                "situations that exercise them ('pass, not exercised')")
MARKER = ("ninelives(scenario, engine=None, mode='sim', seeds=None, profile=None, budget=None, "
          "engine_set=None, swarm=False, require_exercised=None): check the engine's "
          "crash-safety after the test body ran (mode sim, run or explore)")
#: What a marker of each mode takes besides the scenario and the engine.
MODE_ARGS = {"sim": {"seeds", "profile", "engine_set", "swarm", "require_exercised"},
             "run": {"seeds", "profile", "engine_set", "require_exercised"},
             "explore": {"budget", "profile", "engine_set", "swarm", "require_exercised"}}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ninelives", "ninelives: crash-safety checks of an engine")
    for name, metavar, default, text in SETTINGS:
        group.addoption(f"--ninelives-{name}", dest=f"ninelives_{name}", default=None,
                        metavar=metavar, help=text)
        parser.addini(f"ninelives_{name}", text, default=default)
    group.addoption("--ninelives-require-exercised", dest="ninelives_require_exercised",
                    action="store_true", default=None, help=REQUIRE_HELP)
    parser.addini("ninelives_require_exercised", REQUIRE_HELP, type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.option.verbose:
        return None
    s = Settings(config)
    return (f"ninelives: engine {s.get('engine')}, seeds {s.get('seeds')}, profile "
            f"{s.get('profile')}, database {s.database() or 'off'}")


@pytest.fixture
def ninelives(request: pytest.FixtureRequest) -> "NineLives":
    """Checks of an engine's crash-safety that fail the test with the evidence:
    `ninelives.sim(...)`, `ninelives.run(...)`, `ninelives.explore(...)`."""
    return NineLives(request.config, request.node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """After the body of a test marked `ninelives(...)` passed, run the check it names."""
    outcome = yield
    marker = item.get_closest_marker("ninelives")
    if marker is not None:
        NineLives(item.config, item).marked(marker.args, marker.kwargs)
    return outcome


class Settings:
    """The plugin's settings: the command line over the ini file over the defaults."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def get(self, name: str) -> str:
        given = self.config.getoption(f"ninelives_{name}")
        return str(given if given is not None else self.config.getini(f"ninelives_{name}"))

    def source(self, name: str) -> str:
        given = self.config.getoption(f"ninelives_{name}") is not None
        return f"--ninelives-{name}" if given else f"ini ninelives_{name}"

    def require_exercised(self) -> bool:
        given = self.config.getoption("ninelives_require_exercised")
        return bool(given) or bool(self.config.getini("ninelives_require_exercised"))

    def database(self) -> str | None:
        text = self.get("database").strip()
        if text.lower() in ("", "none"):
            return None
        return _shown(os.path.join(str(self.config.rootpath), text))

    def reports(self) -> str:
        """Where the run folders of failing checks go: `runs/` in the database folder (or
        in .ninelives/ when the database is off)."""
        root = self.database() or _shown(os.path.join(str(self.config.rootpath), ".ninelives"))
        return os.path.join(root, "runs")


def _shown(path: str) -> str:
    """`path` relative to the working folder when it lies under it (the replay commands a
    failure prints are then short), else absolute."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel == ".." or rel.startswith(".." + os.sep) else rel


class NineLives:
    """The `ninelives` fixture: each check returns an Outcome (chaos.testing.suite_checks) and, with
    `check=True` (the default), fails the test unless it passed. Arguments left None take
    the plugin's settings (`--ninelives-*` options, `ninelives_*` ini keys)."""

    def __init__(self, config: pytest.Config, node: Any) -> None:
        self.settings, self.node = Settings(config), node

    def sim(self, scenario: str, engine: str | None = None, *,
            seeds: int | str | Iterable[int] | None = None, profile: str | None = None,
            engine_set: dict[str, Any] | None = None, swarm: bool = False,
            require_exercised: bool | None = None, check: bool = True):
        """Simulate `scenario` (a name from scenarios/ or a file) on `engine` (an adapter
        spec; the engine must declare in_process) at the remembered failing seeds, then at
        `seeds` (an int N for 1..N, "A..B", or seeds), stopping at the first failure."""
        from chaos.testing.suite_checks import check_sim
        return self._done(self._guarded(
            check_sim, scenario, self._engine(engine), seeds=self._seeds(seeds),
            profile=self._profile(profile), engine_set=engine_set, swarm=swarm,
            require_exercised=self._require(require_exercised),
            database=self.settings.database(), out=self.settings.reports(),
            shrink_budget=self._shrink(), shard=self._shard()), check)

    def run(self, scenario: str, engine: str | None = None, *,
            seeds: int | str | Iterable[int] | None = None, profile: str | None = None,
            engine_set: dict[str, Any] | None = None, require_exercised: bool | None = None,
            check: bool = True):
        """Run `scenario` with real processes on `engine`: the remembered failing seeds,
        then `seeds` (default: the first seed of the seeds setting, a real run taking
        seconds to minutes), stopping at the first that does not pass."""
        from chaos.testing.suite_checks import check_run
        chosen = self._seeds(seeds)
        chosen = chosen if seeds is not None else chosen[:1]
        return self._done(self._guarded(
            check_run, scenario, self._engine(engine), seeds=chosen,
            profile=self._profile(profile), engine_set=engine_set,
            require_exercised=self._require(require_exercised),
            database=self.settings.database(), out=self.settings.reports(),
            shard=self._shard()), check)

    def explore(self, scenario: str, engine: str | None = None, *,
                budget: float | str | None = None, profile: str | None = None,
                engine_set: dict[str, Any] | None = None, swarm: bool = True, seed: int = 0,
                require_exercised: bool | None = None, check: bool = True):
        """Explore `scenario` on `engine` within `budget` (seconds, or "90s", "5m"),
        replaying this check's corpus first, until a schedule fails."""
        from chaos.testing.suite_checks import check_explore
        return self._done(self._guarded(
            check_explore, scenario, self._engine(engine), budget=self._budget(budget),
            profile=self._profile(profile), engine_set=engine_set, swarm=swarm, seed=seed,
            require_exercised=self._require(require_exercised),
            database=self.settings.database(), out=self.settings.reports(),
            shard=self._shard()), check)

    def check(self, outcome: Any) -> Any:
        """Fail the test with `outcome`'s evidence unless it passed; returns it."""
        if not outcome.passed:
            pytest.fail(outcome.message, pytrace=False)
        return outcome

    def marked(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run the check a `ninelives(...)` marker describes; a marker that names an
        argument its mode does not take fails the test naming it."""
        kwargs = dict(kwargs)
        if args:
            kwargs.setdefault("scenario", args[0])
        mode = kwargs.pop("mode", "sim")
        if mode not in MODE_ARGS:
            pytest.fail(f"@pytest.mark.ninelives: mode must be sim, run or explore, got "
                        f"{mode!r}", pytrace=False)
        wrong = sorted(set(kwargs) - MODE_ARGS[mode] - {"scenario", "engine"})
        if wrong or len(args) > 1 or "scenario" not in kwargs:
            pytest.fail(f"@pytest.mark.ninelives(mode={mode!r}) takes one scenario and "
                        f"{', '.join(sorted(MODE_ARGS[mode]))}; got "
                        + (f"{', '.join(wrong)}" if wrong else f"positional {args!r}"),
                        pytrace=False)
        return getattr(self, mode)(**{k: v for k, v in kwargs.items() if v is not None})

    # -- settings --------------------------------------------------------------------------

    def _done(self, outcome: Any, check: bool) -> Any:
        """Fail the test with a failure's evidence (when checked); a pass's account (the
        seeds tried, the situations reached) is a report section: `pytest -rP` shows it."""
        if outcome.passed or not check:
            self.node.add_report_section("call", "ninelives", outcome.message)
        return self.check(outcome) if check else outcome

    def _guarded(self, run: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a check; what the harness refuses to run (a scenario, an engine, a setting)
        fails the test with its one-line reason, as the command line exits 2 with it."""
        from chaos.engines.adapter_guard import AdapterError
        from chaos.run.runner import HarnessError
        try:
            return run(*args, **kwargs)
        except (AdapterError, HarnessError, ValueError, OSError) as exc:
            pytest.fail(f"ninelives could not run the check: {exc}", pytrace=False)

    def _engine(self, engine: str | None) -> str:
        return engine if engine is not None else self.settings.get("engine")

    def _profile(self, profile: str | None) -> str:
        return profile if profile is not None else self.settings.get("profile")

    def _require(self, given: bool | None) -> bool:
        return given if given is not None else self.settings.require_exercised()

    def _seeds(self, seeds: int | str | Iterable[int] | None) -> list[int]:
        from chaos.commands.flags import parse_seeds
        where = "seeds="
        if seeds is None:
            seeds, where = self.settings.get("seeds"), self.settings.source("seeds")
        try:
            if isinstance(seeds, (int, str)):
                return list(parse_seeds(str(seeds)))
            chosen = [int(s) for s in seeds]
        except (TypeError, ValueError) as exc:
            pytest.fail(f"ninelives {where}: {exc}", pytrace=False)
        if not chosen:
            pytest.fail(f"ninelives {where}: names no seed", pytrace=False)
        return chosen

    def _budget(self, budget: float | str | None) -> float:
        import argparse
        from chaos.explore.cli import budget as parse_budget
        where = "budget="
        if budget is None:
            budget, where = self.settings.get("budget"), self.settings.source("budget")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            budget = f"{budget}"
        try:
            return parse_budget(str(budget))
        except argparse.ArgumentTypeError as exc:
            pytest.fail(f"ninelives {where}: {exc}", pytrace=False)

    def _shard(self) -> Any:
        """The shard of --ninelives-shard (chaos.run.shards, the parser `--shard` uses), None
        for all the seeds."""
        from chaos.run.shards import parse_shard
        text = self.settings.get("shard").strip()
        if not text:
            return None
        try:
            return parse_shard(text)
        except ValueError as exc:
            pytest.fail(f"ninelives {self.settings.source('shard')}: {exc}", pytrace=False)

    def _shrink(self) -> int:
        text = self.settings.get("shrink")
        try:
            value = int(text)
            if value < 0:
                raise ValueError
        except ValueError:
            pytest.fail(f"ninelives {self.settings.source('shrink')}: must be a whole number "
                        f">= 0, got {text[:40]!r}", pytrace=False)
        return value
