"""Loading a Coqui TTS model (the ``coqui-tts`` package) for --tts coqui:
its files, its config, the device it runs on, the checkpoint, and its voices.
Everything here runs once, at start-up (seconds to minutes, blocking); the
synthesis that follows is coqui.py's.

The model comes from a Coqui model folder (``config.json`` and
``model.pth``) or from the ``.pth`` file with its ``config.json`` beside it;
start-up never downloads anything. Whatever is missing or broken is a
``BackendUnavailable`` that says so.

Voices: a multi-speaker VITS's speaker names (``--tts-voice NAME`` picks the
default); for XTTS the cloned voices of ``--tts-voice`` (a speaker wav, or a
folder of them, each named by its file name) followed by the named speakers of
the model's ``speakers_xtts.pth`` (XTTS-v2 ships 58). A cloned voice's
conditioning latents are computed once, at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voice_agent.backends.registry import BackendUnavailable

CHECKPOINT_NAMES = ("model.pth", "model_file.pth", "model_file.pth.tar", "checkpoint.pth")
SPEAKER_FILES = ("speakers.pth", "speakers.json", "speaker_ids.json")
HOW_TO_PROVIDE = (
    "--tts-model takes a Coqui model folder (config.json and model.pth, as `tts --model_name` "
    "downloads into ~/.local/share/tts/<model>) or the model's .pth file with its config.json "
    "beside it; for XTTS-v2 the folder of https://huggingface.co/coqui/XTTS-v2."
)


def model_files(reference: str) -> tuple[Path, Path]:
    """The checkpoint and config.json a --tts-model value names."""
    path = Path(reference).expanduser()
    if not path.exists():
        raise BackendUnavailable(f"Coqui model not found: {path}. " + HOW_TO_PROVIDE)
    if path.is_file():
        checkpoint, folder = path, path.parent
    else:
        folder = path
        found = [folder / name for name in CHECKPOINT_NAMES if (folder / name).is_file()]
        if not found:
            raise BackendUnavailable(
                f"Coqui model folder {folder} holds no {' or '.join(CHECKPOINT_NAMES)}. "
                + HOW_TO_PROVIDE
            )
        checkpoint = found[0]
    config = folder / "config.json"
    if not config.is_file():
        raise BackendUnavailable(f"Coqui model {checkpoint} has no config.json beside it. ")
    return checkpoint, config


def read_config(path: Path) -> Any:
    from TTS.config import load_config

    try:
        json.loads(path.read_text(encoding="utf-8"))
        return load_config(str(path))
    except Exception as exc:
        raise BackendUnavailable(
            f"Coqui model config {path} is not a valid Coqui config: {type(exc).__name__}: {exc}"
        ) from None


def _localise_speakers_file(config: Any, folder: Path) -> None:
    """A model's config names its speakers file where it was trained (or
    downloaded); use the copy in the model's folder when that path is gone."""
    local = next((folder / name for name in SPEAKER_FILES if (folder / name).is_file()), None)
    for holder in (config, config.get("model_args")):
        if holder is None or not holder.get("speakers_file"):
            continue
        named = Path(holder["speakers_file"])
        if not named.is_file():
            if local is None:
                raise BackendUnavailable(
                    f"Coqui model {folder}: its speakers file {named} does not exist and the "
                    f"folder holds none of {', '.join(SPEAKER_FILES)}"
                )
            holder["speakers_file"] = str(local)


def _speaker_wavs(reference: str | None) -> dict[str, Path]:
    """--tts-voice for XTTS: one wav, or a folder of them (by name)."""
    if reference is None:
        return {}
    path = Path(reference).expanduser()
    if path.is_file():
        return {path.stem: path}
    if path.is_dir():
        wavs = {wav.stem: wav for wav in sorted(path.glob("*.wav"))}
        if wavs:
            return wavs
        raise BackendUnavailable(f"--tts-voice folder {path} holds no .wav speaker sample")
    raise BackendUnavailable(
        f"--tts-voice {path} does not exist (for XTTS: a speaker wav or a folder of them)"
    )


def select_device(device: str, threads: int) -> str:
    """The device --tts-device names (auto: CUDA when torch sees a GPU); on
    the CPU, torch computes in ``threads`` threads."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("--tts-device cuda was asked for but torch sees no CUDA GPU")
    if device == "cpu":
        torch.set_num_threads(threads)
    return device


def load_model(config: Any, checkpoint: Path, folder: Path, streams: bool, device: str) -> Any:
    """The model of ``config`` with the weights of ``checkpoint``, on
    ``device``, in eval mode (``streams``: an XTTS model)."""
    import torch
    from TTS.tts.models import setup_model

    try:
        _localise_speakers_file(config, folder)
        model = setup_model(config)
        if streams:
            model.load_checkpoint(
                config, checkpoint_dir=str(folder), checkpoint_path=str(checkpoint), eval=True
            )
        else:
            model.load_checkpoint(config, checkpoint_path=str(checkpoint), eval=True)
    except BackendUnavailable:
        raise
    except Exception as exc:
        raise BackendUnavailable(
            f"cannot load Coqui model {checkpoint}: {type(exc).__name__}: {exc}. " + HOW_TO_PROVIDE
        ) from None
    model.to(torch.device(device))
    model.eval()
    return model


def vits_voices(model: Any, voice: str | None, checkpoint: Path) -> list[str]:
    """A VITS model's speakers, ``voice`` (the default) first; a
    one-speaker model's one voice is named after the model."""
    manager = getattr(model, "speaker_manager", None)
    names = [str(n) for n in manager.speaker_names] if manager is not None else []
    if not names:  # one speaker: named after its model
        names = [checkpoint.parent.name if checkpoint.name == "model.pth" else checkpoint.stem]
        return names
    if voice is not None:
        if voice not in names:
            raise BackendUnavailable(
                f"--tts-voice {voice!r} is not a speaker of {checkpoint} "
                f"(speakers: {', '.join(names)})"
            )
        names.remove(voice)
        names.insert(0, voice)
    return names


def xtts_voices(
    model: Any, config: Any, voice: str | None, checkpoint: Path
) -> dict[str, tuple[Any, Any]]:
    """Each voice's (GPT conditioning latents, speaker embedding), once."""
    latents: dict[str, tuple[Any, Any]] = {}
    for name, wav in _speaker_wavs(voice).items():
        try:
            latents[name] = model.get_conditioning_latents(
                audio_path=[str(wav)],
                max_ref_length=config.max_ref_len,
                gpt_cond_len=config.gpt_cond_len,
                gpt_cond_chunk_len=config.gpt_cond_chunk_len,
                sound_norm_refs=config.sound_norm_refs,
            )
        except Exception as exc:
            raise BackendUnavailable(
                f"cannot clone the voice in {wav}: {type(exc).__name__}: {exc}"
            ) from None
    manager = getattr(model, "speaker_manager", None)
    for name, speaker in manager.speakers.items() if manager is not None else ():
        latents.setdefault(str(name), (speaker["gpt_cond_latent"], speaker["speaker_embedding"]))
    if not latents:
        raise BackendUnavailable(
            f"XTTS model {checkpoint} has no speakers (no speakers_xtts.pth beside it): "
            "pass --tts-voice speaker.wav (a few seconds of clean speech) or a folder of wavs"
        )
    return latents
