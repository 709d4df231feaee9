"""Provider latency distributions given as data, so a sweep can use a user's measured p99.

    fixed:1.5                 every call takes 1.5 s
    uniform:0.5:2.0           uniform between 0.5 and 2.0 s
    lognormal:0.8:3.0         lognormal with p50 0.8 s and p99 3.0 s
    file:latencies.txt        the empirical distribution of a file of seconds, one per line
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

Z99 = statistics.NormalDist().inv_cdf(0.99)


class LatencyError(ValueError):
    """A latency spec that cannot be read; the message names the spec and the problem."""


@dataclass(frozen=True)
class Latency:
    """A distribution of call latencies, sampled by its quantile function."""

    spec: str
    kind: str
    params: tuple[float, ...]

    def quantile(self, u: float) -> float:
        """The latency at quantile `u` in [0, 1)."""
        u = min(max(u, 1e-9), 1 - 1e-9)
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            lo, hi = self.params
            return lo + (hi - lo) * u
        if self.kind == "lognormal":
            p50, p99 = self.params
            sigma = math.log(p99 / p50) / Z99
            return p50 * math.exp(sigma * statistics.NormalDist().inv_cdf(u))
        values = self.params
        return values[min(int(u * len(values)), len(values) - 1)]

    @property
    def p99(self) -> float:
        return self.quantile(0.99)


def parse_latency(spec: str) -> Latency:
    """Read a latency spec (see the module docstring). Raises LatencyError naming it."""
    kind, _, rest = spec.partition(":")
    arity = {"fixed": 1, "uniform": 2, "lognormal": 2}
    if kind not in arity and kind != "file":
        raise LatencyError(f"latency {spec!r}: kind must be fixed, uniform, lognormal or file")
    if kind in arity and len(rest.split(":")) != arity[kind] or not rest:
        raise LatencyError(f"latency {spec!r}: {kind} takes {arity.get(kind, 1)} number(s) "
                           "or a path")
    try:
        if kind == "file":
            with open(rest, encoding="utf-8") as fh:
                values = tuple(sorted(float(line) for line in fh if line.strip()))
            if not values:
                raise LatencyError(f"latency file {rest} holds no values")
            params = values
        else:
            params = tuple(float(x) for x in rest.split(":"))
    except OSError as exc:
        raise LatencyError(f"latency {spec!r}: cannot read {rest}: {exc.strerror}") from None
    except ValueError:
        raise LatencyError(f"latency {spec!r}: the numbers must be seconds") from None
    if not all(math.isfinite(p) for p in params):  # float() reads nan and inf
        raise LatencyError(f"latency {spec!r}: the numbers must be finite seconds")
    if any(p < 0 for p in params):
        raise LatencyError(f"latency {spec!r}: latencies cannot be negative")
    if kind == "uniform" and params[0] > params[1]:
        raise LatencyError(f"latency {spec!r}: low must not exceed high")
    if kind == "lognormal" and not 0 < params[0] < params[1]:
        raise LatencyError(f"latency {spec!r}: needs 0 < p50 < p99")
    return Latency(spec, kind, params)
