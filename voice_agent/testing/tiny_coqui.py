"""Tiny, untrained Coqui models built with Coqui's own config and model
classes and saved as Coqui saves them, for the tests (and bench/coqui_tts.py) to load
through ``--tts coqui``: a two-speaker VITS (~265 k parameters) and an XTTS-v2-style
model (a one-layer GPT over 64 audio codes, its own character vocabulary, the
standard HiFi-GAN decoder and speaker encoder) that streams through
``inference_stream``. They speak noise, not words; what the tests check is
how the audio is made and delivered."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np

VITS_SPEAKERS = ("ann", "bob")
XTTS_SPEAKER = "Studio Voice"  # in its speakers_xtts.pth
# Each XTTS piece is exactly this many GPT tokens (its stop token can never be
# drawn): three streamed chunks of XTTS_CHUNK_TOKENS.
XTTS_TOKENS = 60
XTTS_STRIDE = 256  # output samples (at 22.05 kHz) per GPT token


def build_tiny_vits(folder: Path) -> Path:
    import torch
    from TTS.tts.configs.shared_configs import CharactersConfig
    from TTS.tts.configs.vits_config import VitsArgs, VitsConfig
    from TTS.tts.models.vits import Vits

    folder.mkdir(parents=True, exist_ok=True)
    speakers = folder / "speakers.json"
    speakers.write_text(json.dumps({name: i for i, name in enumerate(VITS_SPEAKERS)}))
    args = VitsArgs(
        hidden_channels=16,
        hidden_channels_ffn_text_encoder=32,
        num_heads_text_encoder=1,
        num_layers_text_encoder=1,
        resblock_kernel_sizes_decoder=[3],
        resblock_dilation_sizes_decoder=[[1, 3, 5]],
        upsample_rates_decoder=[8, 8, 4],
        upsample_initial_channel_decoder=32,
        upsample_kernel_sizes_decoder=[16, 16, 8],
        num_layers_flow=1,
        num_layers_posterior_encoder=1,
        use_sdp=False,
        init_discriminator=False,
        use_speaker_embedding=True,
        speaker_embedding_channels=16,
        speakers_file=str(speakers),
    )
    characters = CharactersConfig(
        characters_class="TTS.tts.models.vits.VitsCharacters",
        characters="abcdefghijklmnopqrstuvwxyz",
        punctuations=" .,!?'-",
        pad="<PAD>",
        eos="<EOS>",
        bos="<BOS>",
        blank="<BLNK>",
    )
    config = VitsConfig(
        model_args=args,
        use_phonemes=False,
        text_cleaner="basic_cleaners",
        characters=characters,
        use_speaker_embedding=True,
        speakers_file=str(speakers),
    )
    config.audio.sample_rate = 16000
    torch.manual_seed(0)
    model = Vits(config)
    torch.save({"model": model.state_dict(), "config": config.to_dict()}, folder / "model.pth")
    # As a downloaded model's: the speakers file named where it was trained;
    # the loader must take the copy beside the model.
    config.speakers_file = config.model_args.speakers_file = "/nonexistent/run/speakers.json"
    config.save_json(str(folder / "config.json"))
    return folder


def speaker_wav(path: Path, hz: float, seconds: float = 2.0) -> Path:
    """A voice sample to clone (a tone: the tiny model does not care)."""
    t = np.arange(int(22050 * seconds)) / 22050
    samples = 0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(22050)
        handle.writeframes((samples * 32767).astype(np.int16).tobytes())
    return path


def build_tiny_xtts(folder: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models
    from TTS.tts.configs.xtts_config import XttsConfig
    from TTS.tts.models.xtts import Xtts, XttsArgs

    folder.mkdir(parents=True, exist_ok=True)
    special = ["[STOP]", "[UNK]", "[SPACE]", "[START]", "[en]"]
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    vocab = {token: i for i, token in enumerate(special + letters)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tokenizer.add_special_tokens(special)
    tokenizer.save(str(folder / "vocab.json"))
    args = XttsArgs(
        gpt_layers=1,
        gpt_n_model_channels=32,
        gpt_n_heads=2,
        decoder_input_dim=32,
        gpt_num_audio_tokens=66,
        gpt_start_audio_token=64,
        gpt_stop_audio_token=65,
        # The GPT makes max_audio_tokens - 3 tokens at most.
        gpt_max_audio_tokens=XTTS_TOKENS + 3,
        gpt_max_text_tokens=200,
        gpt_max_prompt_tokens=70,
        gpt_code_stride_len=XTTS_STRIDE,
        gpt_number_text_tokens=len(vocab),
        gpt_start_text_token=vocab["[START]"],
        gpt_stop_text_token=vocab["[STOP]"],
        gpt_use_perceiver_resampler=True,
        tokenizer_file=str(folder / "vocab.json"),
    )
    # top_k=1: greedy, so the same text and voice always give the same audio.
    config = XttsConfig(model_args=args, languages=["en"], top_k=1)
    torch.manual_seed(0)
    model = Xtts(config)
    with torch.no_grad():
        model.gpt.mel_head.bias[args.gpt_stop_audio_token] = -1e4  # never stops early
    # Saved as Coqui saves a trained XTTS: before eval() adds inference-only parts.
    torch.save({"model": model.state_dict()}, folder / "model.pth")
    config.save_json(str(folder / "config.json"))
    model.eval()
    # A named speaker, as XTTS-v2's speakers_xtts.pth holds 58.
    sample = speaker_wav(folder / "studio.wav", 180.0)
    latent, embedding = model.get_conditioning_latents(audio_path=[str(sample)])
    sample.unlink()
    torch.save(
        {XTTS_SPEAKER: {"gpt_cond_latent": latent, "speaker_embedding": embedding}},
        folder / "speakers_xtts.pth",
    )
    return folder
