"""Where a call's CPU goes: a turn's work and a second of a call, by stage.

The capacity (``voice_agent/capacity.py``) is set from one turn's CPU seconds
in three parts (STT, LLM, TTS). This splits them further, with the models
``voice-agent serve`` loads (its settings, through the registry), in this
process, one stage at a time on an otherwise idle service, so each CPU
figure belongs to that stage alone (this process's CPU and llama-server's):

- a turn: the same turn as the capacity's (the bundled 2.3 s phrase, a
  reply of up to 48 tokens to the same prompt, the same 38 words spoken),
  with Whisper's log-mel features, encoder and decoder apart, the LLM's
  prefill of the service's own system prompt apart from its decoding, one
  end-of-turn decision (Smart Turn on 8 s) and one words reading, and the
  reply's audio encoded to Opus;
- a second of a call: the caller's audio decoded (Opus as a browser sends
  it, or G.711), down-mixed and resampled to 16 kHz, the VAD, the echo
  canceller of G.711 calls, and the agent's audio encoded while it speaks.

What a call costs beyond these (RTP, SRTP, RTCP, the event loop, Python
per packet) is not a stage that can be run alone: ``bench/idle.py``
measures a whole idle call; the difference is that.

Each figure is the median of ``--repeats`` runs after one unmeasured run.

    .venv/bin/python bench/stage_cost.py
    .venv/bin/python bench/stage_cost.py --repeats 9 --setting stt_threads=1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiortc.codecs import get_decoder, get_encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from voice_agent.audio.echo import EchoCanceller
from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import synthesize
from voice_agent.capacity import PHRASE, REPLY_PROMPT, REPLY_TOKENS, SPOKEN_REPLY, process_cpu_s
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.rtc.inbound import frame_to_mono_int16
from voice_agent.rtc.opus import OpusStream
from voice_agent.testing.figures import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.opus_decode_wer import _audio_frames, encode_browser_like

RATE = 16_000
FRAME_16K = 320  # 20 ms
PCMU = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8000, channels=1, payloadType=0)
OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)


STT_PARTS = {
    "features": "log-mel features",
    "encoder": "encoder",
    "decoder": "decoder",
    "rest": "batching, tokens, Python",
}


class Clock:
    """CPU seconds of this process (every thread) and of llama-server."""

    def __init__(self, llama_pid: int | None) -> None:
        self._llama = llama_pid

    def read(self) -> tuple[float, float]:
        llama = process_cpu_s(self._llama) if self._llama else None
        return time.process_time(), llama or 0.0


class Ledger:
    """CPU seconds spent inside named stages, summed over one run."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.process_time()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.process_time() - start

    def wrap(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return func(*args, **kwargs)

        return timed


class _TimedWhisper:
    """CTranslate2's Whisper with its encoder's CPU counted (it is a C++
    object: its methods cannot be replaced, so this stands in for it)."""

    def __init__(self, model: Any, ledger: Ledger) -> None:
        self._model = model
        self.encode = ledger.wrap("encoder", model.encode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def instrument_whisper(stt: Any, ledger: Ledger) -> None:
    """Count faster-whisper's features, encoder and ONNX decoder apart.
    Reaches into the backend's parts: a bench's view, not an interface."""
    batches = stt._batches
    batches._features = ledger.wrap("features", batches._features)
    if batches._encoder is not None:  # ONNX Runtime's
        batches._encoder.encode = ledger.wrap("encoder", batches._encoder.encode)
    else:  # CTranslate2's
        stt._model.model = _TimedWhisper(stt._model.model, ledger)
    onnx = batches._onnx
    if onnx is not None:
        onnx.generate = ledger.wrap("decoder", onnx.generate)


async def median_cpu(
    clock: Clock, repeats: int, work: Callable[[], Awaitable[Any]]
) -> tuple[float, float]:
    """Median CPU seconds (here, llama-server) of ``work``, after a first run."""
    here: list[float] = []
    llama: list[float] = []
    for index in range(repeats + 1):
        before = clock.read()
        await work()
        after = clock.read()
        if index:
            here.append(after[0] - before[0])
            llama.append(after[1] - before[1])
    return statistics.median(here), statistics.median(llama)


async def llm_request(
    http: aiohttp.ClientSession, engine: Engine, max_tokens: int
) -> dict[str, Any]:
    """One reply from the embedded server with the service's system prompt,
    its prompt cache off so that every request pays the prefill."""
    config = engine.llm_config
    assert config is not None
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    body = {
        "model": config.model,
        "messages": [
            {"role": "system", "content": engine.settings.llm_instructions},
            {"role": "user", "content": REPLY_PROMPT},
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
    }
    url = config.base_url.rstrip("/") + "/chat/completions"
    async with http.post(url, json=body, headers=headers) as response:
        response.raise_for_status()
        reply: dict[str, Any] = await response.json()
        return reply


def per_second(repeats: int, seconds: float, work: Callable[[], object]) -> float:
    """Median CPU milliseconds per second of audio that ``work`` handles."""
    work()
    spent = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        spent.append(time.process_time() - start)
    return 1000 * statistics.median(spent) / seconds


def call_second_rows(engine: Engine, speech: np.ndarray, repeats: int) -> list[list[object]]:
    """A second of a call, stage by stage: ms of CPU per s, % of a core."""
    assert engine.models is not None
    frames_48k = _audio_frames(speech)  # with 0.5 s of silence each side
    framed_s = len(frames_48k) * 0.02
    speech_s = speech.size / RATE
    opus_packets = encode_browser_like(speech)
    pcmu = get_encoder(PCMU)
    pcmu_packets = [packet for frame in _audio_frames(speech) for packet in pcmu.encode(frame)[0]]

    def decode(codec: RTCRtpCodecParameters, packets: list[bytes], step: int) -> None:
        decoder = get_decoder(codec)
        for i, payload in enumerate(packets):
            for frame in decoder.decode(JitterFrame(data=payload, timestamp=i * step)):
                frame_to_mono_int16(frame)  # type: ignore[arg-type]

    def resample() -> None:
        to_16k = StreamResampler(48_000, RATE)
        for frame in frames_48k:
            to_16k.process(frame.to_ndarray().reshape(-1))

    def vad() -> None:
        stream = engine.models.vad.new_stream()  # type: ignore[union-attr]
        for start in range(0, speech.size - FRAME_16K + 1, FRAME_16K):
            stream.speech_probability(speech[start : start + FRAME_16K])

    def echo() -> None:
        played = 0
        canceller = EchoCanceller(lambda: played // 3)
        far = np.repeat(speech, 3)  # the agent's own audio, at 48 kHz
        for start in range(0, speech.size - FRAME_16K + 1, FRAME_16K):
            canceller.played(far[3 * start : 3 * (start + FRAME_16K)], 3 * start)
            played = 3 * (start + FRAME_16K)
            canceller.process(speech[start : start + FRAME_16K], start)
        canceller.close()

    mono_48k = [frame.to_ndarray().reshape(-1) for frame in frames_48k]

    def encode_opus() -> None:
        encoder = OpusStream()  # the outbound track's own: mono, 32 kb/s
        for samples in mono_48k:
            encoder.encode(samples)

    rows = [
        (
            "Opus decode, a browser's 32 kb/s voice",
            framed_s,
            lambda: decode(OPUS, opus_packets, 960),
        ),
        ("G.711 (PCMU) decode", framed_s, lambda: decode(PCMU, pcmu_packets, 160)),
        ("48 -> 16 kHz resampling", framed_s, resample),
        (f"VAD ({engine.settings.vad}), speech", speech_s, vad),
        ("echo canceller (G.711 calls only)", speech_s, echo),
        ("Opus encode of the agent's audio, while it speaks", framed_s, encode_opus),
    ]
    out: list[list[object]] = []
    for name, seconds, work in rows:
        ms = per_second(repeats, seconds, work)
        out.append([name, f"{ms:.2f}", f"{ms / 10:.3f}"])
    return out


async def turn_rows(engine: Engine, repeats: int) -> list[list[object]]:
    """A turn's work, stage by stage: CPU ms here and in llama-server."""
    models = engine.models
    assert models is not None
    llama_pid = engine.llama.pid if engine.llama is not None else None
    clock = Clock(llama_pid)
    phrase = np.fromfile(PHRASE, dtype="<i2").astype(np.int16)
    rows: list[list[object]] = []

    def row(name: str, here: float, llama: float, note: str) -> None:
        rows.append([name, f"{1000 * here:.0f}", f"{1000 * llama:.0f}", note])

    ledger = Ledger()
    instrument_whisper(models.stt, ledger)
    await models.stt.transcribe(phrase)
    parts: dict[str, list[float]] = {}
    for _ in range(repeats):
        ledger.spent.clear()
        start = time.process_time()
        await models.stt.transcribe(phrase)
        whole = time.process_time() - start
        ledger.spent["rest"] = whole - sum(ledger.spent.values())
        for name, spent in ledger.spent.items():
            parts.setdefault(name, []).append(spent)
    for name, label in STT_PARTS.items():
        value = statistics.median(parts.get(name, [0.0]))
        row(f"STT: {label}", value, 0.0, f"{phrase.size / RATE:.1f} s of speech")

    if models.turn is not None and models.turn.semantic:
        turn = models.turn
        window = np.tile(phrase, 4)[: 8 * RATE]
        here, llama = await median_cpu(clock, repeats, lambda: turn.completion(window))
        row(f"end of turn: {turn.name}, one decision", here, llama, "8 s of audio")
    if models.words is not None:
        words = models.words
        here, llama = await median_cpu(
            clock, repeats, lambda: words.completion("My number is five five")
        )
        row("end of turn: words, one reading", here, llama, "an unsure 'complete' only")

    if llama_pid is not None:
        async with aiohttp.ClientSession() as http:
            replies: list[dict[str, Any]] = []

            async def ask(tokens: int) -> None:
                replies.append(await llm_request(http, engine, tokens))

            here1, llama1 = await median_cpu(clock, repeats, lambda: ask(1))
            prompt_tokens = replies[-1]["usage"]["prompt_tokens"]
            here_n, llama_n = await median_cpu(clock, repeats, lambda: ask(REPLY_TOKENS))
            made = replies[-1]["usage"]["completion_tokens"]
        row("LLM: prefill and the first token", here1, llama1, f"{prompt_tokens} prompt tokens")
        decoded = max(1, made - 1)
        row(
            f"LLM: {decoded} more tokens decoded",
            here_n - here1,
            llama_n - llama1,
            f"{1000 * (llama_n - llama1) / decoded:.1f} ms a token",
        )

    tts = models.tts
    here, llama = await median_cpu(clock, repeats, lambda: synthesize(tts, SPOKEN_REPLY))
    spoken_s = (await synthesize(tts, SPOKEN_REPLY)).size / tts.sample_rate
    row(f"TTS: {tts.name}", here, llama, f"{len(SPOKEN_REPLY.split())} words, {spoken_s:.1f} s")
    here_sum = sum(float(str(r[1])) for r in rows)
    llama_sum = sum(float(str(r[2])) for r in rows)
    rows.append(["all of the above", f"{here_sum:.0f}", f"{llama_sum:.0f}", ""])
    return rows


def _setting_value(raw: str) -> Any:
    """A number, a boolean, null or a list as JSON; anything else a string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    values: dict[str, Any] = {"max_calls": 1}  # a fixed capacity: nothing measured at start
    for item in args.setting:
        key, _, raw = item.partition("=")
        values[key] = _setting_value(raw)
    engine = Engine(Settings(**values))
    await engine.start()
    try:
        turn = await turn_rows(engine, args.repeats)
        speech = np.fromfile(PHRASE, dtype="<i2").astype(np.int16)
        second = await asyncio.to_thread(call_second_rows, engine, speech, args.repeats)
    finally:
        await engine.stop()
    print(f"\n## A turn's CPU by stage, median of {args.repeats}\n")
    print(table(turn, ["stage", "CPU ms, this process", "CPU ms, llama-server", "what"]))
    print(f"\n## A second of a call by stage, median of {args.repeats}\n")
    print(table(second, ["stage", "CPU ms per s", "% of a core"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="measured runs a stage")
    parser.add_argument(
        "--setting", action="append", default=[], help="a Settings field, NAME=VALUE"
    )
    asyncio.run(main(parser.parse_args()))
