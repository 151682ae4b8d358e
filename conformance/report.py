"""The suite's report: a header naming what was tested, then one row per check."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

STATUSES = ("pass", "fail", "skip", "xfail", "xpass", "error")


@dataclass
class CheckResult:
    id: str
    status: str          # pass | fail | skip | xfail (expected failure, failed) | xpass (expected failure, passed)
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "skip", "xfail")


@dataclass
class Report:
    header: dict
    results: list[CheckResult] = field(default_factory=list)
    # undeclared capability (or capabilities) -> the checks skipped for it: what this run does not certify
    not_certified: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def by_id(self) -> dict[str, CheckResult]:
        return {r.id: r for r in self.results}

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES if any(r.status == s for r in self.results)}

    def to_json(self) -> str:
        return json.dumps({"header": self.header, "ok": self.ok, "counts": self.counts(),
                           "not_certified": self.not_certified, "results": [asdict(r) for r in self.results]},
                          indent=2)

    def table(self) -> str:
        h = self.header
        lines = [f"Conduit conformance  conduit {h.get('conduit')}  adapter {h.get('adapter')} {h.get('adapter_version')}"
                 f"  framework {h.get('framework')} {h.get('framework_version')}  level {h.get('level')}"
                 f"  seed {h.get('seed')}",
                 f"capabilities: {', '.join(h.get('capabilities', []))}", ""]
        w = max([len(r.id) for r in self.results] + [5])
        for r in self.results:
            mark = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "xfail": "xfail", "xpass": "XPASS",
                    "error": "ERROR"}[r.status]
            lines.append(f"  {r.id:<{w}}  {mark:<5}  {r.seconds:6.2f}s  {r.detail}".rstrip())
        c = self.counts()
        if self.not_certified:
            lines += ["", "not certified (capabilities the harness does not declare; --require CAP makes one a "
                          "failure):"]
            lines += [f"  {caps}: {len(ids)} check{'s' if len(ids) > 1 else ''} skipped ({', '.join(ids)})"
                      for caps, ids in sorted(self.not_certified.items())]
        skipped = sum(len(ids) for ids in self.not_certified.values())
        verdict = ("  -> OK" + (f" ({skipped} not certified)" if skipped else "")) if self.ok else "  -> FAILED"
        lines += ["", "  " + ", ".join(f"{v} {k}" for k, v in c.items()) + verdict]
        return "\n".join(lines)
