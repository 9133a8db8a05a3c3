"""N concurrent callers through Parakeet's batched path, in real time.

Each simulated stream (a caller) speaks LibriVox utterances one after
another, each in real time: while an utterance "plays", the audio so far is
sent for a partial transcript every ``--partial-interval-ms`` (at most one in
flight per stream, as the service's sessions do; only if the backend makes
partials), and at the utterance's end its final transcript is requested,
through the backend's own entry points (``transcribe_partial``,
``transcribe``: the process-wide batching worker the service shares between
calls). A pause follows (``--gap-s``: the agent's reply), then the next
utterance. Streams start at random offsets within one utterance-and-pause
cycle (and within the run), so their finals do not all arrive at once. Each
N runs for ``--seconds``: every stream speaks at least once, none starts an
utterance after that, those under way finish.

Per N it prints:

- first final p50/p95/max: end of the utterance's audio (when the last
  sample would have arrived) to its final text, in ms. The service's own
  end-of-turn wait (the silence that ends a turn) comes on top of this.
- RTF: the model's compute time (every batch it ran, finals and partials)
  over the seconds of speech the streams spoke. Below 1 the model keeps up.
- busy: that compute time over the run's wall time. One model runs one batch
  at a time, so near 100 % it is saturated and finals queue.
- mean/max batch: the sizes of the batches it ran in the run (finals and
  partials together), from the backend's own stats.
- partials done/shed: answered, or refused (``None``) because finals were
  waiting or the partial queue was full, as the service sheds them.
- failures: finals and partials that raised; timeouts: finals not back
  within ``--timeout-s`` (the service's ``--stt-timeout-s``).
- WER: the finals' mean word error rate against the clips' transcripts, a
  check that the device's path (half precision on CUDA) still hears words.
  The tiny model only knows one of the clips (0880): near 1 is its normal.

    .venv/bin/python bench/stt_streams.py --tiny --device cpu --streams 1,4 --seconds 10
    .venv/bin/python bench/stt_streams.py --device cuda --streams 1,10,50,100 --seconds 60
    .venv/bin/python bench/stt_streams.py --model parakeet-tdt-0.6b-v2.nemo --max-batch 32

``--model`` takes what ``--stt-model`` takes (a .nemo file, a Hugging Face
repo id already in the local cache, a NeMo name in NeMo's cache); nothing is
downloaded. ``--tiny`` builds the tests' tiny CTC model instead (about a
minute on 2 cores): its figures say what the batching machinery costs, not
what Parakeet costs. bench/gpu.sh runs this on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend
from voice_agent.backends.capabilities import PartialTranscriber, ReportsStats
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.stt.parakeet import DEFAULT_MODEL
from voice_agent.config import Settings
from voice_agent.testing.audio_data import RATE, librivox, reference, word_error_rate
from voice_agent.testing.figures import percentile, table

CLIP_NAMES = ("0870", "0880", "0890", "0920", "0930")  # 7.1, 3.0, 5.3, 6.1, 3.3 s
HEADER = [
    "streams",
    "utterances",
    "finals",
    "first final p50 ms",
    "p95 ms",
    "max ms",
    "RTF",
    "busy",
    "mean batch",
    "max batch",
    "partials done/shed",
    "failures",
    "timeouts",
    "WER",
]
COLUMNS = [name.rjust(8) for name in HEADER]
LEGEND = (
    "first final: end of the utterance's audio to its final text. RTF: model compute time "
    "(all batches, finals and partials) / seconds of speech spoken; below 1 keeps up. busy: "
    "compute time / wall time (one batch at a time: near 100 % is saturated). batch: sizes of "
    "the batches run (finals and partials), from the backend's stats. partials shed: refused "
    "while finals waited. failures: finals and partials that raised; timeouts: finals past "
    "--timeout-s. WER: the finals' mean word error rate."
)


@dataclass(frozen=True)
class Plan:
    """How every stream behaves in one run."""

    seconds: float  # no utterance starts after this (but each stream's first)
    partial_interval_s: float  # 0: no partials
    gap_s: tuple[float, float]  # the pause after each utterance, uniform in this range
    timeout_s: float  # a final later than this is a timeout


@dataclass(frozen=True)
class Clip:
    audio: np.ndarray  # 16 kHz int16
    text: str  # what is said

    @property
    def seconds(self) -> float:
        return len(self.audio) / RATE


@dataclass
class Tally:
    """What the streams of one run saw."""

    utterances: int = 0
    audio_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)  # word error rate of each final
    partials_done: int = 0
    partials_shed: int = 0
    failures: int = 0
    timeouts: int = 0


@dataclass(frozen=True)
class WorkerCounts:
    """The batching worker's cumulative counters, from the backend's stats."""

    batch_sizes: dict[int, int]
    busy_s: float

    def since(self, before: WorkerCounts) -> WorkerCounts:
        sizes = {
            size: count - before.batch_sizes.get(size, 0)
            for size, count in self.batch_sizes.items()
            if count > before.batch_sizes.get(size, 0)
        }
        return WorkerCounts(sizes, self.busy_s - before.busy_s)


def worker_counts(stt: SttBackend) -> WorkerCounts | None:
    """None for a backend that reports no batching stats."""
    if not isinstance(stt, ReportsStats):
        return None
    stats = stt.stats()
    sizes = stats.get("batch_sizes")
    inference = stats.get("inference")
    if not isinstance(sizes, dict) or not isinstance(inference, dict):
        return None
    count = float(inference.get("count", 0))
    mean_ms = float(inference.get("mean_ms", 0.0))
    return WorkerCounts({int(k): int(v) for k, v in sizes.items()}, count * mean_ms / 1000)


async def _partial(stt: PartialTranscriber, audio: np.ndarray, tally: Tally) -> None:
    try:
        text = await stt.transcribe_partial(audio)
    except asyncio.CancelledError:
        raise
    except Exception:
        tally.failures += 1
        return
    if text is None:
        tally.partials_shed += 1
    else:
        tally.partials_done += 1


async def speak(stt: SttBackend, clip: Clip, plan: Plan, tally: Tally) -> None:
    """One utterance in real time: partials while it plays, then its final."""
    loop = asyncio.get_running_loop()
    audio = clip.audio
    start = loop.time()
    end = start + len(audio) / RATE
    partials = stt if isinstance(stt, PartialTranscriber) and plan.partial_interval_s else None
    task: asyncio.Task[None] | None = None
    requested_s = 0.0  # how far into the utterance the last partial was asked for
    tally.utterances += 1
    tally.audio_s += len(audio) / RATE
    try:
        while partials is not None and (now := loop.time()) < end:
            heard_s = now - start
            if task is None and heard_s - requested_s >= plan.partial_interval_s:
                requested_s = heard_s
                so_far = audio[: int(heard_s * RATE)]
                task = asyncio.create_task(_partial(partials, so_far, tally), name="bench-partial")
            if task is not None:
                # As a session does: the next partial only once this one is back.
                done, _ = await asyncio.wait({task}, timeout=end - loop.time())
                if done:
                    task = None
                continue
            wake = min(end, start + requested_s + plan.partial_interval_s)
            await asyncio.sleep(wake - loop.time())
    finally:
        if task is not None:
            task.cancel()  # the turn ended: a session stops its partial
    await asyncio.sleep(max(0.0, end - loop.time()))  # the rest of the audio
    try:
        async with asyncio.timeout(plan.timeout_s):
            text = await stt.transcribe(audio)
    except TimeoutError:
        tally.timeouts += 1
        return
    except Exception:
        tally.failures += 1
        return
    tally.latencies_s.append(loop.time() - end)
    tally.errors.append(word_error_rate(clip.text, text))


async def stream(
    stt: SttBackend,
    index: int,
    clips: Sequence[Clip],
    plan: Plan,
    tally: Tally,
    rng: random.Random,
    deadline: float,
) -> None:
    """One caller: a random start within one cycle (and within the run),
    then turn after turn; at least one."""
    loop = asyncio.get_running_loop()
    cycle_s = sum(c.seconds for c in clips) / len(clips) + sum(plan.gap_s) / 2
    await asyncio.sleep(rng.uniform(0.0, min(cycle_s, plan.seconds)))
    turn = index
    while True:
        await speak(stt, clips[turn % len(clips)], plan, tally)
        turn += 1
        gap_s = rng.uniform(*plan.gap_s)
        if loop.time() + gap_s >= deadline:
            return  # its next utterance would start after the run
        await asyncio.sleep(gap_s)


async def run_level(
    stt: SttBackend, streams: int, clips: Sequence[Clip], plan: Plan, seed: int
) -> list[object]:
    """One run of ``streams`` concurrent callers: its table row."""
    loop = asyncio.get_running_loop()
    before = worker_counts(stt)
    tally = Tally()
    started = loop.time()
    deadline = started + plan.seconds
    await asyncio.gather(
        *(
            stream(stt, i, clips, plan, tally, random.Random(seed * 100_003 + i), deadline)
            for i in range(streams)
        )
    )
    wall_s = loop.time() - started
    after = worker_counts(stt)
    lat_ms = [s * 1000 for s in tally.latencies_s]
    rtf: object = "-"
    busy: object = "-"
    mean_batch: object = "-"
    max_batch: object = "-"
    if before is not None and after is not None:
        run = after.since(before)
        if tally.audio_s:
            rtf = f"{run.busy_s / tally.audio_s:.3f}"
        busy = f"{100 * run.busy_s / wall_s:.0f} %"
        batches = sum(run.batch_sizes.values())
        if batches:
            mean_batch = f"{sum(k * n for k, n in run.batch_sizes.items()) / batches:.1f}"
            max_batch = max(run.batch_sizes)
    return [
        streams,
        tally.utterances,
        len(lat_ms),
        f"{percentile(lat_ms, 50):.0f}" if lat_ms else "-",
        f"{percentile(lat_ms, 95):.0f}" if lat_ms else "-",
        f"{max(lat_ms):.0f}" if lat_ms else "-",
        rtf,
        busy,
        mean_batch,
        max_batch,
        f"{tally.partials_done}/{tally.partials_shed}",
        tally.failures,
        tally.timeouts,
        f"{sum(tally.errors) / len(tally.errors):.2f}" if tally.errors else "-",
    ]


async def warm_up(stt: SttBackend, clips: Sequence[Clip], batch: int) -> None:
    """A full batch of the longest clip and a partial: the first calls pay
    for lazy initialisation (CUDA kernels, allocator), which a run must not."""
    longest = max(clips, key=lambda c: c.seconds).audio
    await asyncio.gather(*(stt.transcribe(longest) for _ in range(batch)))
    if isinstance(stt, PartialTranscriber):
        await stt.transcribe_partial(longest[:RATE])


async def measure(
    settings: Settings, levels: Sequence[int], plan: Plan, seed: int, label: str
) -> list[list[object]]:
    stt: SttBackend = await asyncio.to_thread(registry.create, "stt", "parakeet", settings)
    try:
        clips = [Clip(librivox(name), reference(name)) for name in CLIP_NAMES]
        await warm_up(stt, clips, settings.stt_max_batch)
        partials = isinstance(stt, PartialTranscriber) and plan.partial_interval_s > 0
        print(
            f"model {label} on {getattr(stt, 'device', settings.stt_device)}; "
            f"--stt-max-batch {settings.stt_max_batch}, "
            f"--stt-batch-wait-ms {settings.stt_batch_wait_ms}, "
            f"--stt-partial-max-batch {settings.stt_partial_max_batch}; partials "
            + (f"every {plan.partial_interval_s * 1000:.0f} ms" if partials else "off")
            + f"; {len(clips)} LibriVox clips, {sum(c.seconds for c in clips):.1f} s; "
            f"pause {plan.gap_s[0]:g}-{plan.gap_s[1]:g} s; {plan.seconds:g} s per run",
            flush=True,
        )
        # Each row as its run ends (a long GPU run shows progress, and a
        # crash keeps the rows done), in columns wide enough for any figure.
        print(table([], COLUMNS), flush=True)
        rows: list[list[object]] = []
        for streams in levels:
            rows.append(await run_level(stt, streams, clips, plan, seed))
            print(table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
        return rows
    finally:
        stt.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a .nemo file or a cached pretrained name (default: %(default)s)",
    )
    source.add_argument(
        "--tiny", action="store_true", help="build the tests' tiny CTC model (CPU smoke run)"
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--streams", default="1,10,50,100", help="concurrent streams per run (comma-separated)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each run")
    parser.add_argument(
        "--partial-interval-ms",
        type=int,
        help="partials every this many ms of speech (0: off; default: the backend's, 500)",
    )
    parser.add_argument("--gap-s", default="1,3", help="pause after each utterance: min,max")
    parser.add_argument("--max-batch", type=int, help="--stt-max-batch (default: the service's)")
    parser.add_argument("--batch-wait-ms", type=int, help="--stt-batch-wait-ms")
    parser.add_argument("--partial-max-batch", type=int, help="--stt-partial-max-batch")
    parser.add_argument("--threads", type=int, help="--stt-threads (CPU inference threads)")
    parser.add_argument("--timeout-s", type=float, help="--stt-timeout-s (default: the service's)")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("nv_one_logger").setLevel(logging.ERROR)  # NeMo's telemetry notices
    levels = [int(x) for x in args.streams.split(",") if x.strip()]
    low, high = (float(x) for x in args.gap_s.split(","))
    overrides = {
        "stt_max_batch": args.max_batch,
        "stt_batch_wait_ms": args.batch_wait_ms,
        "stt_partial_max_batch": args.partial_max_batch,
        "stt_threads": args.threads,
        "stt_timeout_s": args.timeout_s,
        "stt_partial_interval_ms": args.partial_interval_ms,
    }
    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            from voice_agent.testing.tiny_nemo import build_tiny_ctc

            model, label = str(build_tiny_ctc(Path(scratch) / "tiny")), "tiny CTC 64x2"
        else:
            model, label = args.model, args.model
        settings = Settings(stt="parakeet", stt_model=model, stt_device=args.device, **values)
        interval_ms = settings.stt_partial_interval_ms
        if interval_ms is None:
            from voice_agent.backends.stt.parakeet import ParakeetStt

            interval_ms = ParakeetStt.default_partial_interval_ms
        plan = Plan(args.seconds, interval_ms / 1000, (low, high), settings.stt_timeout_s)
        try:
            asyncio.run(measure(settings, levels, plan, args.seed, label))
        except BackendUnavailable as exc:
            print(f"stt_streams: cannot load the model: {exc}", file=sys.stderr)
            return 1
    print(LEGEND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
