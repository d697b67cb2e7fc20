"""Learned phase times: what a job's iterations really take, once enough of them are seen.

Admission plans a new job with its worst-case times (every response at max tokens). Runtime is
shorter and uneven: rollouts run close to the cap (the longest response decides), training
follows the tokens generated. The learner keeps the last `learn_window` measured iterations of
each job (solo-normalised: rollout on its own N_R GPUs, train on its own N_T, sync included) and,
from `learn_min_samples` on, gives a `PhaseProfile` the policy plans the member with:

- phase times: the `learn_quantile` (default 0.9) of the recent iterations, a robust high
  percentile, so one short iteration does not make the group over-commit;
- the solo iteration its SLO is judged against: the mean of recent solo iterations, capped by the
  planned worst case, which is what the job's owner would measure running alone.

Before it is confident the profile is None and the policy keeps the worst case. A job with no
measurements yet is still judged against a learned yardstick (`prior`): its planned phases scaled
by the fleet's measured shrinkage (the 10th percentile, over jobs already learned, of mean measured
over planned time, per phase), so a job whose training will shrink at runtime is not admitted into
a group whose period only fits its worst case.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.state import PhaseProfile
from rollmux.core.errors import SpecError
from rollmux.core.model import JobSpec

PRIOR_MIN_JOBS = 3
"""Learned jobs needed before the fleet prior replaces the worst case as a newcomer's yardstick."""

UNLEARNED_SLO_MARGIN = 0.02
"""Before the fleet prior exists a newcomer's SLO is judged against its planned T_solo less this share:
its realised solo iteration will be shorter, and a co-located job's fixed costs (state loads) do not
shrink with it, so a plan that just meets the SLO against the worst case misses it against the real one."""


class PhaseLearner:
    """Per-job windows of measured (rollout, train) seconds."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._seen: dict[str, deque[tuple[float, float]]] = {}
        self._planned: dict[str, tuple[float, float]] = {}
        self._shrink: dict[str, tuple[float, float]] = {}  # learned job -> mean measured / planned, per phase

    def register(self, spec: JobSpec) -> None:
        """Remember the planned (worst-case) times of a job whose iterations will be observed."""
        assert spec.t_roll_s is not None and spec.t_train_s is not None
        self._planned[spec.name] = (spec.t_roll_s, spec.t_train_s)

    def shrink(self) -> tuple[float, float]:
        """Fleet prior of measured over planned time (rollout, train): the 10th percentile over learned jobs."""
        if len(self._shrink) < PRIOR_MIN_JOBS:
            return 1.0, 1.0
        ratios = np.asarray(list(self._shrink.values()))
        r, t = (min(1.0, float(np.quantile(ratios[:, k], 0.1))) for k in (0, 1))
        return r, t

    def prior(self, spec: JobSpec) -> PhaseProfile:
        """Worst-case phase times, with the SLO judged against the fleet-prior solo iteration."""
        planned = PhaseProfile.planned(spec)
        r, t = self.shrink()
        if (r, t) == (1.0, 1.0):  # nothing learned yet: the worst case, judged with a margin
            return PhaseProfile(t_roll_s=planned.t_roll_s, t_train_s=planned.t_train_s,
                                t_solo_s=planned.t_solo_s * (1.0 - UNLEARNED_SLO_MARGIN))
        return PhaseProfile(t_roll_s=planned.t_roll_s, t_train_s=planned.t_train_s,
                            t_solo_s=planned.t_roll_s * r + planned.t_train_s * t)

    def observe(self, job: str, roll_s: float, train_s: float) -> None:
        """Record one finished iteration (seconds, solo-normalised)."""
        if not (roll_s >= 0 and train_s >= 0):
            raise SpecError(f"phase times of {job}: roll_s={roll_s!r}, train_s={train_s!r} are invalid: expected >= 0")
        window = self._seen.setdefault(job, deque(maxlen=self.config.learn_window))
        window.append((float(roll_s), float(train_s)))

    def samples(self, job: str) -> int:
        return len(self._seen.get(job, ()))

    def profile(self, spec: JobSpec) -> PhaseProfile | None:
        """The learned profile of `spec`, or None until `learn_min_samples` iterations are seen."""
        window = self._seen.get(spec.name)
        if not self.config.learn or window is None or len(window) < self.config.learn_min_samples:
            return None
        data = np.asarray(window)
        q = self.config.learn_quantile
        roll, train = (float(x) for x in np.quantile(data, q, axis=0))  # one call: it runs per iteration live
        solo = min(float(np.mean(data.sum(axis=1))), spec.t_solo_s)
        if spec.name in self._planned:
            pr, pt = self._planned[spec.name]
            self._shrink[spec.name] = (float(np.mean(data[:, 0])) / pr, float(np.mean(data[:, 1])) / pt)
        return PhaseProfile(t_roll_s=roll, t_train_s=train, t_solo_s=solo, learned=True)

    def forget(self, job: str) -> None:
        """Drop a departed job's window (its measured shrinkage stays in the fleet prior)."""
        self._seen.pop(job, None)
        self._planned.pop(job, None)
