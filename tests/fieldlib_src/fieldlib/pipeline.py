"""Library-style pipeline code, the patterns the instrumentation layer must handle:

- ``SignalPipeline``: a PipelineAsync subclass with its own ``create()`` that builds its
  CooperativeGroups itself and calls ``_make_sync_object`` without the ``phase`` argument
  (full first, then empty), constructs the pipeline directly, has a no-op ``producer_commit``
  (the full barrier is arrived by ``producer_publish``, a method of another name) and
  ``_w_index_phase``-style wrappers that build a PipelineState from a raw index and phase;
- ``make_pipe``: one helper line that creates every pipeline of a kernel;
- ``StateWAdvance`` / ``make_state``: the library's own pipeline state class and factory
  (not cutlass's make_pipeline_state), rebuilt through its own ``__new_from_mlir_values__``;
- ``Reader``: a wrapper class whose methods call the pipeline's waits inside lambdas;
- ``ExchangePipeline`` / ``exchange_wait`` (ring.py, like quack's PipelineStasAsync and
  cluster_reduce): a subclass whose ``producer_commit`` is a no-op the kernel never calls (the
  data path arrives on ``producer_get_barrier``'s barrier itself), waited on by a raw
  mbarrier wait with a phase the kernel reads from its state; ``StateWAdvance.advance_iters``
  advances several steps at once (quack's PipelineStateWAdvance).
"""

from __future__ import annotations

from dataclasses import dataclass

from cutlass import Int32, cute
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import (
    Agent,
    CooperativeGroup,
    PipelineAsync,
    PipelineOp,
    PipelineState,
    PipelineUserType,
)


class StateWAdvance(PipelineState):
    """The library's state class (like quack's PipelineStateWAdvance)."""

    @dsl_user_op
    def advance_iters(self, num_iterations, *, loc=None, ip=None):
        self._count += Int32(num_iterations)
        index = self._index + Int32(num_iterations)
        self._phase ^= index // self.stages
        self._index = index % self.stages

    def __new_from_mlir_values__(self, values):
        return StateWAdvance(self.stages, Int32(values[0]), Int32(values[1]), Int32(values[2]))


def make_state(kind: PipelineUserType, stages: int) -> StateWAdvance:
    """Producers start at phase 1 (their first acquire passes), consumers at 0."""
    phase = 1 if kind is PipelineUserType.Producer else 0
    return StateWAdvance(stages, Int32(0), Int32(0), Int32(phase))


@dataclass(frozen=True)
class SignalPipeline(PipelineAsync):
    @staticmethod
    def create(
        num_stages: int, producer_threads: int, consumer_threads: int, barrier_storage
    ) -> SignalPipeline:
        producer = (PipelineOp.AsyncThread, CooperativeGroup(Agent.Thread, producer_threads))
        consumer = (PipelineOp.AsyncThread, CooperativeGroup(Agent.Thread, consumer_threads))
        full = PipelineAsync._make_sync_object(barrier_storage, num_stages, producer)
        empty = PipelineAsync._make_sync_object(barrier_storage + num_stages, num_stages, consumer)
        return SignalPipeline(full, empty, num_stages, None, None)

    @dsl_user_op
    def producer_commit(self, state, *, loc=None, ip=None):
        """No-op: the full barrier is arrived by producer_publish."""

    @dsl_user_op
    def producer_publish(self, state, *, loc=None, ip=None):
        self.sync_object_full.arrive(state.index, self.producer_mask, loc=loc, ip=ip)

    @dsl_user_op
    def consumer_wait_w_index_phase(self, index, phase, *, loc=None, ip=None):
        self.consumer_wait(PipelineState(0, Int32(0), index, phase), loc=loc, ip=ip)


def make_pipe(storage, stages: int, producer_threads: int, consumer_threads: int):
    return SignalPipeline.create(stages, producer_threads, consumer_threads, storage)


class Reader:
    """Consumer-side wrapper: waits and releases inside lambdas."""

    def __init__(self, pipe: SignalPipeline):
        self.pipe = pipe

    def wait(self, state) -> None:
        run = lambda: self.pipe.consumer_wait(state)  # noqa: E731
        run()

    def release(self, state) -> None:
        run = lambda: self.pipe.consumer_release(state)  # noqa: E731
        run()


@dataclass(frozen=True)
class ExchangePipeline(PipelineAsync):
    """full[s]: one arrive, by the data path (not by producer_commit); empty[s]: every
    consumer thread releases."""

    @staticmethod
    def create(num_stages: int, consumer_threads: int, barrier_storage) -> ExchangePipeline:
        producer = (PipelineOp.AsyncThread, CooperativeGroup(Agent.Thread, 1))
        consumer = (PipelineOp.AsyncThread, CooperativeGroup(Agent.Thread, consumer_threads))
        full = PipelineAsync._make_sync_object(barrier_storage, num_stages, producer)
        empty = PipelineAsync._make_sync_object(barrier_storage + num_stages, num_stages, consumer)
        return ExchangePipeline(full, empty, num_stages, None, None)

    @dsl_user_op
    def producer_commit(self, state, *, loc=None, ip=None):
        """No-op: the data path arrives on the full barrier."""
        pass


def exchange_wait(mbar, phase) -> None:
    """The data path's own wait on a stage's full barrier (like quack's cluster_reduce)."""
    cute.arch.mbarrier_wait(mbar, phase=phase)
