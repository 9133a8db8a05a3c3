"""A tiny NeMo FastConformer CTC model, built from nothing for the tests
(and untrained ones of realistic sizes for the benchmarks).

Real Parakeet weights can't be downloaded here, so the tests train their own:
a character SentencePiece tokenizer, a 2-layer d_model 64 FastConformer with
a CTC head, overfitted on two recorded phrases (deterministic: fixed seeds,
fixed augmentation), saved as a ``.nemo`` file that the parakeet backend then
loads exactly as a user's file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from voice_agent.testing.audio_data import RATE, goforward, librivox, reference, speech_bounds

# (audio, transcript) pairs the model learns.
PHRASES: list[tuple[str, str]] = [
    ("goforward", "go forward ten meters"),
    ("0880", reference("0880")),
]
# When each word ends (s), read off a CTC alignment of a model trained on the
# whole phrases: training on cut-off audio labelled with the words it holds
# teaches the model to transcribe speech in progress (partial transcripts).
WORD_ENDS: dict[str, list[float]] = {
    "goforward": [0.60, 1.43, 1.79, 2.27],
    "0880": [0.36, 0.56, 0.84, 1.00, 1.40, 2.03, 2.63, 2.80],
}
STEPS = 400


def phrase_audio(name: str) -> np.ndarray:
    """The recording of one of PHRASES, 16 kHz int16."""
    return goforward() if name == "goforward" else librivox(name)


def _config(tokenizer_dir: Path, d_model: int, layers: int, subsampling: int = 4) -> dict[str, Any]:
    return {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": 16000,
            "normalize": "per_feature",
            "window_size": 0.025,
            "window_stride": 0.01,
            "features": 80,
            "n_fft": 512,
            "dither": 0.0,
            "pad_to": 0,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 80,
            "n_layers": layers,
            "d_model": d_model,
            # FastConformer's depthwise-striding subsampling, but 4x rather
            # than Parakeet's 8x: with a character vocabulary, 80 ms frames
            # are too few for CTC to spell fast speech out.
            "subsampling": "dw_striding",
            "subsampling_factor": subsampling,
            "subsampling_conv_channels": min(d_model, 256),
            "n_heads": 4,
            "conv_kernel_size": 9,
            "ff_expansion_factor": 4,
            "self_attention_model": "rel_pos",
            "dropout": 0.0,
            "dropout_pre_encoder": 0.0,
            "dropout_emb": 0.0,
            "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
            "feat_in": d_model,
            "num_classes": -1,
            "vocabulary": [],
        },
    }


def _train_tokenizer(folder: Path) -> None:
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    texts = [text for _, text in PHRASES]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 10),
        model_prefix=str(folder / "tokenizer"),
        model_type="char",
        vocab_size=len(set("".join(texts))) + 2,  # + <unk> and the word marker
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    (folder / "vocab.txt").write_text("".join(piece + "\n" for piece in pieces))


def _example(
    name: str, clip: np.ndarray, text: str, prefix: bool, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    """A random cut around the speech, padding and gain: the model must not
    depend on where the turn detector starts and ends the audio it hears.
    A prefix example ends shortly after a random word, labelled up to it."""
    start_s, end_s = speech_bounds((clip * 32768).astype(np.int16))
    words = text.split()
    tail_s = rng.uniform(0.05, 0.3)
    if prefix:
        count = int(rng.integers(1, len(words)))
        end_s, words = WORD_ENDS[name][count - 1], words[:count]
        tail_s = rng.uniform(0.03, 0.15)  # at most the onset of the next word
    start = int(max(0.0, start_s - rng.uniform(0.1, 0.4)) * RATE)
    end = int(min(len(clip) / RATE, end_s + tail_s) * RATE)
    lead = np.zeros(int(rng.integers(0, RATE // 10)), np.float32)
    audio = np.concatenate((lead, clip[start:end])) * np.float32(rng.uniform(0.3, 1.5))
    return audio, " ".join(words)


def build_tiny_ctc(folder: Path) -> Path:
    """Train the model into ``folder`` and return its .nemo file."""
    import torch
    from nemo.collections.asr.models import EncDecCTCModelBPE
    from omegaconf import OmegaConf

    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    _train_tokenizer(folder / "tokenizer")
    model = EncDecCTCModelBPE(cfg=OmegaConf.create(_config(folder / "tokenizer", 64, 2)))
    clips = [phrase_audio(name).astype(np.float32) / 32768.0 for name, _ in PHRASES]
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-3)
    # Warm up, then anneal to zero: the last steps settle on an exact fit.
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=8e-3, total_steps=STEPS, pct_start=0.1
    )
    model.train()
    for _ in range(STEPS):
        examples = [
            _example(name, clip, text, prefix, rng)
            for (name, text), clip in zip(PHRASES, clips, strict=True)
            for prefix in (False, False, True)
        ]
        batch = [audio for audio, _ in examples]
        targets = [model.tokenizer.text_to_ids(label) for _, label in examples]
        lengths = torch.tensor([len(b) for b in batch])
        signal = torch.zeros(len(batch), int(lengths.max()))
        for i, b in enumerate(batch):
            signal[i, : len(b)] = torch.from_numpy(b.astype(np.float32))
            signal[i, : len(b)] += torch.randn(len(b)) * 0.002
        target_lengths = torch.tensor([len(t) for t in targets])
        padded = torch.zeros(len(targets), int(target_lengths.max()), dtype=torch.long)
        for i, t in enumerate(targets):
            padded[i, : len(t)] = torch.tensor(t)
        log_probs, encoded_len, _ = model.forward(input_signal=signal, input_signal_length=lengths)
        loss = model.loss(
            log_probs=log_probs,
            targets=padded,
            input_lengths=encoded_len,
            target_lengths=target_lengths,
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    path = folder / "tiny-fastconformer-ctc.nemo"
    model.save_to(str(path))
    return path


def build_untrained_ctc(folder: Path, d_model: int, layers: int) -> Path:
    """A FastConformer CTC of a realistic size with random weights: for
    measuring compute (benchmarks), not words."""
    import torch
    from nemo.collections.asr.models import EncDecCTCModelBPE
    from omegaconf import OmegaConf

    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    torch.manual_seed(0)
    _train_tokenizer(folder / "tokenizer")
    config = _config(folder / "tokenizer", d_model, layers, subsampling=8)
    config["encoder"]["n_heads"] = max(4, d_model // 64)
    model = EncDecCTCModelBPE(cfg=OmegaConf.create(config))
    model.eval()
    path = folder / f"untrained-fastconformer-ctc-{d_model}x{layers}.nemo"
    model.save_to(str(path))
    return path


# TDT's durations: how many frames a token (or blank) may skip.
TDT_DURATIONS = [0, 1, 2, 3, 4]


def build_untrained_transducer(folder: Path, kind: str) -> Path:
    """A tiny FastConformer transducer ("rnnt" or "tdt", Parakeet's default)
    with random weights: its output is nonsense, but it goes through NeMo's
    transducer decoding, which returns Hypothesis objects, not strings.
    (Training one is out of reach here: TDT's loss only runs on CUDA.)"""
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    torch.manual_seed(0)
    _train_tokenizer(folder / "tokenizer")
    d_model, hidden = 64, 32
    config = _config(folder / "tokenizer", d_model, 1)
    config["model_defaults"] = {"enc_hidden": d_model, "pred_hidden": hidden}
    config["decoder"] = {
        "_target_": "nemo.collections.asr.modules.RNNTDecoder",
        "vocab_size": -1,
        "blank_as_pad": True,
        "prednet": {"pred_hidden": hidden, "pred_rnn_layers": 1, "dropout": 0.0},
    }
    config["joint"] = {
        "_target_": "nemo.collections.asr.modules.RNNTJoint",
        "num_classes": -1,
        "vocabulary": [],
        "jointnet": {
            "joint_hidden": hidden,
            "activation": "relu",
            "dropout": 0.0,
            "encoder_hidden": d_model,
            "pred_hidden": hidden,
        },
    }
    config["decoding"] = {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}}
    if kind == "tdt":
        config["joint"]["num_extra_outputs"] = len(TDT_DURATIONS)
        config["decoding"].update({"model_type": "tdt", "durations": TDT_DURATIONS})
        config["loss"] = {
            "loss_name": "tdt",
            "tdt_kwargs": {"durations": TDT_DURATIONS, "sigma": 0.02, "omega": 0.1},
        }
    model = EncDecRNNTBPEModel(cfg=OmegaConf.create(config))
    model.eval()
    path = folder / f"untrained-fastconformer-{kind}.nemo"
    model.save_to(str(path))
    return path
