"""Request bodies of the REST API.

`TTSRequest` mirrors fish-speech's ServeTTSRequest so existing clients work unchanged (unknown
fields are ignored, as there); `SpeechRequest` mirrors OpenAI's /v1/audio/speech. Ranges of the
sampling fields are checked again by engine.params.SamplingParams, which owns them.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

import pybase64
from pydantic import BaseModel, BeforeValidator, Field

from engine import params as P
from engine.params import SamplingParams

AudioFormat = Literal["wav", "pcm", "mp3", "flac", "opus"]
AUDIO_FORMATS: tuple[str, ...] = AudioFormat.__args__

# The reference treats a str audio longer than 255 characters as base64 (JSON cannot carry bytes).
_BASE64_MIN_LENGTH = 256


def _audio_bytes(value):
    if isinstance(value, str):
        if len(value) < _BASE64_MIN_LENGTH:
            raise ValueError("reference audio must be the file's bytes (base64-encoded in JSON)")
        try:
            return pybase64.b64decode(value, validate=True)  # SIMD: ~60x the standard library's (a 10 s clip: 3 ms)
        except (binascii.Error, ValueError):
            pass
        try:  # what pybase64 refuses and the standard library accepts (extra trailing padding) stays accepted
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("reference audio is not valid base64") from None
    return value


class ReferenceAudio(BaseModel):
    audio: Annotated[bytes, BeforeValidator(_audio_bytes)] = Field(
        description="Audio file bytes (wav, mp3, flac, ...); base64 in JSON bodies."
    )
    text: str = Field(description="Transcript of the reference audio.")


def _range(bounds, description: str, **extra):
    low, high = bounds
    return Field(ge=low, le=high, description=f"{description} ({low}..{high})", **extra)


_DEFAULTS = SamplingParams()


class SamplingFields(BaseModel):
    """The generation knobs shared by /v1/tts and /v1/tts/batch."""

    chunk_length: int = _range(P.CHUNK_LENGTH_RANGE, "characters of text per chunk", default=_DEFAULTS.chunk_length)
    seed: int | None = Field(default=None, description="Fixed seed for repeatable output; none = random.")
    max_new_tokens: int = _range(
        P.MAX_NEW_TOKENS_RANGE, "frames per text chunk at most, 0 = no limit", default=_DEFAULTS.max_new_tokens
    )
    top_p: float = _range(P.TOP_P_RANGE, "nucleus sampling", default=_DEFAULTS.top_p)
    repetition_penalty: float = _range(
        P.REPETITION_PENALTY_RANGE, "repetition penalty", default=_DEFAULTS.repetition_penalty
    )
    temperature: float = _range(P.TEMPERATURE_RANGE, "sampling temperature", default=_DEFAULTS.temperature)
    normalize: bool = Field(default=True, description="Accepted for compatibility; text is used as given.")
    use_memory_cache: Literal["on", "off"] = Field(
        default="off", description="Accepted for compatibility; references are always cached by content."
    )

    def sampling_params(self) -> SamplingParams:
        # The reference makes negative seeds positive and caps them at 2**31.
        seed = None if self.seed is None else min(abs(self.seed), P.SEED_RANGE[1])
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            max_new_tokens=self.max_new_tokens,
            chunk_length=self.chunk_length,
            seed=seed,
        )


class VoiceFields(BaseModel):
    references: list[ReferenceAudio] = Field(default_factory=list, description="Inline reference voices.")
    reference_id: str | None = Field(default=None, description="A saved voice; takes priority over references.")
    format: AudioFormat = Field(default="wav", description="Output audio format.")


class TTSRequest(SamplingFields, VoiceFields):
    text: str = Field(description="Text to speak.")
    streaming: bool = Field(default=False, description="Send audio as it is produced (wav, pcm).")


class BatchTTSRequest(SamplingFields, VoiceFields):
    texts: list[str] = Field(min_length=1, description="Texts to speak, one audio file each, same voice.")


class SpeechRequest(SamplingFields):
    """OpenAI's POST /v1/audio/speech. The sampling fields of /v1/tts are accepted too
    (OpenAI SDKs send them through `extra_body`)."""

    model: str = Field(default="s1-mini", description="Accepted for compatibility; one model is served.")
    input: str = Field(description="Text to speak.")
    voice: str = Field(
        default="default", description="A saved voice id, or an OpenAI voice name for the default voice."
    )
    response_format: Literal["mp3", "opus", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0, description="Only 1.0 is supported.")
    stream: bool = Field(default=False, description="Send audio as it is produced.")


class RenameReferenceRequest(BaseModel):
    old_reference_id: str
    new_reference_id: str


class DeleteReferenceRequest(BaseModel):
    reference_id: str
