"""How the rounds of a fit on a dask cluster reach the workers, and what happens when
workers leave.

A :class:`Rounds` belongs to one :class:`~onnxgrad_sklearn._dask.placement.DaskRows`
(the training rows, or a validation set's). It runs the fit's training rounds as
calls of a server on each worker (:meth:`Rounds.serve`, :class:`.worker._Server`, a
dask actor), and the other work on the partitions as tasks pinned to their workers
(:meth:`Rounds.run`, :meth:`Rounds.by_rows`). When a worker holding partitions
leaves meanwhile, it waits for dask to compute them again, places them anew, sends
the workers again what they were sent once (:meth:`Rounds.recover`) and runs the
round again; or it raises :class:`DaskWorkerLostError`, naming the partitions lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter

import numpy as np

from .worker import _Server

logger = logging.getLogger("onnxgrad_sklearn")

#: Seconds a round waits before it checks that the workers it runs on are alive.
POLL_S = 1.0
#: Seconds to wait, after workers holding partitions left, for dask to compute them again.
RECOVERY_S = 60.0
#: Times one evaluation is repeated after a loss of workers, at most.
MAX_RECOVERIES = 3
#: What a task carries (a validation set's row numbers) in more bytes than this is
#: scattered to its workers instead. What tasks carry passes through the scheduler,
#: which keeps the last messages to each worker (as the client keeps the last it sent:
#: ``distributed.admin.low-level-log-length``, 1000 by default): bytes in tasks stay in
#: both processes' memory long after the round. The training rounds are calls of the
#: workers' servers (:meth:`Rounds.serve`), which nothing keeps.
INLINE_BYTES = 64 << 10


class DaskWorkerLostError(RuntimeError):
    """Partitions of the training rows were lost with their worker and not computed again."""


class _WorkersLost(Exception):
    def __init__(self, addresses):
        super().__init__(sorted(addresses))
        self.addresses = set(addresses)


class Rounds:
    """The transport of the rounds of one :class:`DaskRows` (``rows``), and its recovery
    after workers leave.

    Reads the rows' client, partitions, placement and what the workers are sent once
    (``rows.payloads``); a recovery places the partitions anew (``rows.place``).

    Parameters
    ----------
    rows : DaskRows
        The rows whose partitions the rounds run on.

    Attributes
    ----------
    calls : collections.Counter
        The rounds each worker served (its address: the calls of its server).
    """

    def __init__(self, rows):
        self.rows = rows
        self.calls = Counter()
        # the last round's tasks and what was scattered for them, released as the next
        # round is submitted (:meth:`run`)
        self._last_round = None
        # the training rounds' servers (:class:`_Server`, dask actors): {(placement
        # version, stage, held-out rows' key): {worker: (future, actor)}}
        self._servers = {}
        self._pinned = None  # (positions, version, {worker: future}): by_rows's picks

    @property
    def client(self):
        return self.rows.client

    # tasks ----------------------------------------------------------------------
    def by_rows(self, positions, function, args=()):
        """``function(*args, picks, *partitions)`` on each worker holding some of the
        rows ``positions``: its arrays, put back in the order of ``positions``.

        ``args``: a tuple, or a callable giving it (read again when the tasks are sent
        again). A worker that leaves meanwhile: as in a round (:meth:`serve`), dask
        computes its partitions again and the tasks are sent again, or an error names
        the lost partitions.
        """
        rows, slots = self.rows, {}

        def tasks():
            picks, places = rows.picks(positions, slots=True)
            slots.update(places)
            given = args() if callable(args) else args
            sent = self._pin(positions, picks)
            return {
                a: (function, *given, sent[a], *[rows.parts[k] for k in picks[a]]) for a in picks
            }

        found = self.run(tasks)
        out = []
        for j, first in enumerate(next(iter(found.values()))):
            result = np.empty((len(positions), *first.shape[1:]), dtype=first.dtype)
            for a, values in found.items():
                result[slots[a]] = values[j]
            out.append(result)
        return out

    def _pin(self, positions, picks):
        """``picks`` (``{worker: {partition: row numbers}}``) of the rows ``positions``
        as the tasks carry them: a worker's picks of more than ``INLINE_BYTES`` are
        scattered to it, once for the same ``positions`` and placement (the validation
        rows, predicted at each epoch)."""
        pinned = self._pinned
        if pinned is not None and pinned[0] is positions and pinned[1] == self.rows.version:
            return pinned[2]
        sent = {
            a: self._send(p, a) if sum(i.nbytes for i in p.values()) > INLINE_BYTES else p
            for a, p in picks.items()
        }
        self._pinned = (positions, self.rows.version, sent)
        return sent

    def _send(self, value, address):
        """``value`` scattered to the worker ``address`` alone (its future)."""
        return self.client.scatter([value], workers=[address], hash=False)[0]

    def run(self, tasks):
        """Run the tasks ``tasks()`` gives (``{worker: (function, *arguments)}``), each
        pinned to its worker; ``{worker: result}`` in the order of the workers'
        addresses.

        A worker that leaves meanwhile: dask computes its partitions again
        (:meth:`recover`) and the tasks, made again for the new placement, are run
        again; or an error names the partitions lost (:meth:`lost_error`).
        """
        client = self.client
        futures = {}

        def attempt():
            futures.clear()
            made = self._made(tasks)
            # the last round's futures are released here, just before the submits: the
            # client sends its messages to the scheduler at most once every 10 ms, so a
            # release sent alone at the end of a round would hold the next round's
            # submits back until then
            self._last_round = None
            for address, task in sorted(made.items()):
                futures[address] = client.submit(
                    *task, workers=[address], allow_other_workers=False, pure=False
                )
            results = self._gather(futures)
            self._last_round = (made, futures)
            return dict(zip(futures, results))

        def release():  # no task left behind: a lost worker, an error, Ctrl-C
            client.cancel(list(futures.values()))

        return self._retried(attempt, on_lost=release, on_error=release)

    def _made(self, tasks):
        """``tasks()``; a worker of the placement that leaves as they are made (what is
        scattered to it fails): :class:`_WorkersLost`, once the scheduler knows it."""
        try:
            return tasks()
        except Exception:
            deadline = time.monotonic() + 2 * POLL_S
            while True:
                gone = set(self.rows.placement) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _gather(self, futures):
        from distributed import wait

        pending = list(futures.values())
        while True:
            try:
                wait(pending, timeout=POLL_S)
                return self.client.gather(pending)
            except (TimeoutError, asyncio.TimeoutError):  # slow, or a worker is gone: a task
                # pinned to a worker that left never runs
                gone = set(futures) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
            except Exception:  # cancelled for lost dependencies, KilledWorker, an error
                gone = set(futures) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
                raise

    # calls of the servers --------------------------------------------------------
    def serve(self, stage, dropped, method, calls):
        """A call of ``method`` of the servers (:class:`_Server`, dask actors, one on each
        worker of the placement holding its partitions and what ``stage`` and
        ``dropped`` name in ``rows.payloads``) of the workers ``calls()`` gives
        (``{worker: arguments}`` for the placement of the moment); their results in the
        order of the workers' addresses.

        A call goes to its worker directly (through the scheduler's proxy when the
        client does not connect to workers): no task, no message batched by the
        client or the scheduler, and what it carries is not kept after it. A worker
        that leaves: as :meth:`run`, the partitions computed again and the round run
        again on servers made for the new placement.
        """

        def attempt():
            made = {}
            servers = self._servers_for(stage, dropped)
            self._last_round = None
            for address, arguments in sorted(calls().items()):
                try:
                    call = getattr(servers[address][1], method)
                except RuntimeError:  # "Worker holding Actor was lost"
                    self._lost_or_raise(address)
                made[address] = call(*arguments)
            results = [self._call_result(address, c) for address, c in made.items()]
            self.calls.update(made.keys())
            return results

        return self._retried(attempt, on_lost=self.drop_servers)

    def _retried(self, attempt, on_lost, on_error=None):
        """``attempt()``, made again after workers were lost (:class:`_WorkersLost`):
        ``on_lost()`` releases what the attempt made, the partitions are computed again
        (:meth:`recover`) or an error names those lost. ``on_error()``: what another
        exception releases before it goes on."""
        for tries in itertools.count():
            try:
                return attempt()
            except _WorkersLost as lost:
                on_lost()
                self._recover_or_raise(lost.addresses, tries)
            except BaseException:
                if on_error is not None:
                    on_error()
                raise

    def _servers_for(self, stage, dropped):
        """``{worker: (future, actor)}``: a :class:`_Server` on each worker of the
        placement, made once per placement, stage and held-out rows."""
        rows = self.rows
        if self._servers and next(iter(self._servers))[0] != rows.version:
            self.drop_servers()  # made for another placement
        key = (rows.version, stage, dropped)
        if key in self._servers:
            return self._servers[key]
        payload = rows.payloads[stage][1]
        held = None if dropped is None else rows.payloads[dropped][1]
        futures = {
            address: self.client.submit(
                _Server,
                payload,
                rows.fit_id,
                stage,
                held,
                sorted(ks),
                *[rows.parts[k] for k in sorted(ks)],
                workers=[address],
                allow_other_workers=False,
                actor=True,
            )
            for address, ks in sorted(rows.placement.items())
        }
        try:
            actors = self._gather(futures)
        except BaseException:
            self.client.cancel(list(futures.values()))
            raise
        self._servers[key] = {a: (futures[a], actor) for a, actor in zip(futures, actors)}
        return self._servers[key]

    def _call_result(self, address, call):
        """The result of an actor's call on ``address``, waiting as :meth:`_gather` does:
        :class:`_WorkersLost` when the worker left meanwhile."""
        while True:
            try:
                return call.result(timeout=POLL_S)
            except (TimeoutError, asyncio.TimeoutError):
                if address not in self.client.nthreads():
                    raise _WorkersLost({address}) from None
            except OSError:  # a closed connection: the worker left, as the scheduler says
                self._lost_or_raise(address)

    def _lost_or_raise(self, address):
        """:class:`_WorkersLost` once the scheduler says ``address`` left (2 polls at most),
        or the exception being handled."""
        deadline = time.monotonic() + 2 * POLL_S
        while address in self.client.nthreads():
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        raise _WorkersLost({address}) from None

    def drop_servers(self):
        """Release the servers: each worker drops its actor (a call in progress ends
        there, its result unused)."""
        servers, self._servers = self._servers, {}
        futures = [future for made in servers.values() for future, _ in made.values()]
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)

    # recovery ---------------------------------------------------------------------
    def _recover_or_raise(self, gone, attempt):
        """:meth:`recover` after the ``attempt``-th try of a round lost the workers
        ``gone``; past :data:`MAX_RECOVERIES`, the error naming the lost partitions."""
        if attempt >= MAX_RECOVERIES:
            raise self.lost_error(gone, self.lost_parts(gone)) from None
        self.recover(gone)

    def lost_parts(self, addresses):
        """The numbers in X of the partitions placed on the workers ``addresses``."""
        rows = self.rows
        return sorted(rows.index[k] for a in addresses for k in rows.placement.get(a, ()))

    def recover(self, gone):
        """Wait for dask to compute the partitions of the workers that left again."""
        rows = self.rows
        lost = self.lost_parts(gone)
        logger.warning(
            "dask worker(s) %s left the cluster during the fit, holding partitions %s of "
            "the %s: waiting up to %.0f s for dask to compute them again, then "
            "the evaluation is repeated.",
            ", ".join(sorted(gone)),
            lost,
            rows.kind,
            RECOVERY_S,
        )
        holders, alive = self._wait_for_partitions(gone)
        rows.place(holders, alive)
        # what the workers were sent, where it is needed (a validation set's workers
        # receive the fit's)
        for entry in rows.fit.payloads.values():
            entry[1] = rows.fit.scatter(entry[0])
        if rows.fit is not rows:
            for entry in rows.payloads.values():
                entry[1] = rows.scatter(entry[0])
        logger.info("partitions %s are back: the evaluation is repeated.", lost)

    def _wait_for_partitions(self, gone):
        """``(holders, alive)`` once every partition is held by a live worker: the
        scheduler's ``who_has`` of the partitions and the workers alive; the error
        naming the partitions lost when one failed, or is not back in
        :data:`RECOVERY_S`."""
        rows, client = self.rows, self.client
        deadline = time.monotonic() + RECOVERY_S
        while True:
            # cancelled: what they were made from is lost too (data sent from here)
            failed = [k for k, f in enumerate(rows.parts) if f.status in ("error", "cancelled")]
            if failed:
                raise self.lost_error(gone, [rows.index[k] for k in failed])
            alive = set(client.nthreads())
            try:
                holders = client.who_has(rows.parts)
            except Exception:  # a partition cancelled meanwhile: seen at the next check
                holders = {}
            missing = [
                k for k, f in enumerate(rows.parts) if not set(holders.get(f.key, ())) & alive
            ]
            if missing and time.monotonic() > deadline:
                raise self.lost_error(gone, [rows.index[k] for k in missing])
            if not missing and alive:
                return holders, alive
            time.sleep(0.2)

    def lost_error(self, gone, parts):
        """The :class:`DaskWorkerLostError` of the partitions ``parts`` (their numbers in
        X), lost with the workers ``gone``."""
        return DaskWorkerLostError(
            f"Partitions {parts} of the {self.rows.kind} were on the dask worker(s) "
            f"{', '.join(sorted(gone))}, which left the cluster during the fit, and dask "
            f"could not compute them again within {RECOVERY_S:.0f} s (data scattered "
            "or loaded from this process cannot be computed again; rows made by a dask "
            "graph, such as dd.read_parquet or da.random, can): the fit stops, the "
            "estimator keeping the weights of the last evaluation. Fit again once the "
            "cluster is whole."
        )

    def close(self):
        """Forget the last round and the pinned picks, and release the servers."""
        self._pinned = None
        self._last_round = None
        self.drop_servers()
