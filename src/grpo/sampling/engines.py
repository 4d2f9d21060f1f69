"""Several engines as one (`vllm_url=[...]`): requests shared out among those up, a failed one
left out by every trainer process from the same version on, one weights file per machine.
"""

from __future__ import annotations

from grpo.sampling.engine import EngineError, Generated, Request


class Engines:
    """Several engines as one (`vllm_url=[...]`), shared by every trainer process that samples
    on them.

    generate      the requests shared out in contiguous runs among the engines that are up, sent
                  side by side; a run whose engine fails goes to the next engine up (each request
                  carries its seed and every engine holds the same version, so it draws the same
                  tokens there), and the failed engine is left out from then on
    load_weights  the same version into every engine up; under several trainer processes,
                  `meet` (every process calls it at the same points, with the engines it has up,
                  and gets every process's) holds each until all have finished sampling with the
                  old version, process 0 alone sends, and none samples again until every engine
                  holds the new one. An engine whose load fails is left out: it may hold half of
                  a version, and is never asked again, by any process: at each meeting every
                  process leaves out what any process has left out.
    """

    def __init__(self, engines: list, *, sends: bool = True, meet=None, log=print):
        if not engines:
            raise EngineError("no engine to sample on")
        self.engines, self.up = list(engines), list(engines)
        self.sends, self.meet, self.log = sends, meet, log
        self.version = min(e.version for e in engines)
        self.lora_rank = min(e.lora_rank for e in engines)
        # where the servers read weights and adapters from (one directory: the run's setting)
        self.weights_parent = getattr(engines[0], "weights_parent", None)
        limits = [e.max_model_len for e in engines if e.max_model_len is not None]
        self.max_model_len = min(limits) if limits else None
        self.name = engines[0].name if len(engines) == 1 else \
            f"{len(engines)} engines ({', '.join(e.name for e in engines)})"

    def _down(self, engine, error: Exception, what: str) -> None:
        if engine in self.up:
            self.up.remove(engine)
        left = f"{len(self.up)} of {len(self.engines)} left" if self.up else "none left"
        self.log(f"{engine.name} failed {what} and is left out ({left}): {error}")

    def _alive(self, what: str) -> list:
        if not self.up:
            raise EngineError(f"every engine has failed ({', '.join(e.name for e in self.engines)}); "
                              f"the last while {what}")
        return list(self.up)

    def generate(self, requests: list[Request]) -> list[Generated]:
        from concurrent.futures import ThreadPoolExecutor
        if len(self.engines) == 1:
            return self.engines[0].generate(requests)
        engines = self._alive("sampling")
        n = len(engines)
        runs = [requests[len(requests) * i // n:len(requests) * (i + 1) // n] for i in range(n)]
        out: list = [None] * n
        pending = [(i, engines[i]) for i in range(n) if runs[i]]
        while pending:
            with ThreadPoolExecutor(len(pending)) as pool:
                done = {i: pool.submit(_try, e.generate, runs[i]) for i, e in pending}
            retry = []
            for i, engine in pending:
                result, error = done[i].result()
                if error is None:
                    out[i] = result
                    continue
                self._down(engine, error, f"sampling {len(runs[i])} completions")
                others = self._alive(f"sampling {len(runs[i])} completions")
                retry.append((i, others[i % len(others)]))
            pending = retry
        return [g for run in out if run is not None for g in run]

    def load_weights(self, weights, version: int) -> None:
        """Every engine up loads `version`; servers that read their weights from a folder on one
        machine (`write`, `reload`) share one file: the first writes it, each reloads from it."""
        weights, written = list(weights), {}

        def load(engine):
            if not (hasattr(engine, "write") and hasattr(engine, "reload")):
                return engine.load_weights(weights, version)
            if engine.weights_parent not in written:
                written[engine.weights_parent] = engine.write(weights, version)
            engine.reload(written[engine.weights_parent], version)
        self._each(load, version, "loading weights")

    def load_adapter(self, path: str, version: int) -> None:
        """Every engine up loads the adapter in `path` (process 0's: the others give "")."""
        self._each(lambda e: e.load_adapter(path, version), version, "loading an adapter",
                   held="adapter_loaded")

    def _agree(self, what: str) -> None:
        """Meet the other trainer processes; leave out every engine that any of them left out."""
        if self.meet is None:
            return
        everyones = self.meet([self.engines.index(e) for e in self.up])
        kept = set.intersection(*(set(up) for up in everyones))
        for engine in [e for e in self.up if self.engines.index(e) not in kept]:
            self._down(engine, EngineError("another trainer process left it out"), what)

    def _each(self, load, version: int, what: str, held: str = "loaded") -> None:
        # every process has finished sampling with the old version, and all leave out the same
        self._agree(f"{what} (version {version})")
        engines = self._alive(f"{what} (version {version})")
        if self.sends:
            for engine in engines:     # one at a time: each reads the same tensors
                try:
                    load(engine)
                except EngineError as e:
                    if len(self.engines) == 1:
                        raise
                    self._down(engine, e, f"{what} (version {version})")
        self._agree(f"{what} (version {version})")   # ... none samples before every engine holds
        for engine in self._alive(f"{what} (version {version})"):   # the new one, none uses one left out
            if not self.sends and hasattr(engine, held):
                getattr(engine, held)(version)   # process 0 loaded it: what this process uses
        self.version = version

    def sleep(self) -> None:
        for e in self.up:
            e.sleep()

    def wake(self) -> None:
        for e in self.up:
            e.wake()

    def health(self) -> str | None:
        problems = [p for p in (e.health() for e in self.engines) if p]
        return "; ".join(problems) or None

    def close(self) -> None:
        for e in self.engines:
            e.close()


def _try(call, *args):
    try:
        return call(*args), None
    except EngineError as e:
        return None, e
