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
from engine.audio_stream import SAMPLE_RATE_RANGE, SPEED_RANGE, VOLUME_DB_RANGE, OutputSpec
from engine.params import SamplingParams

AudioFormat = Literal["wav", "pcm", "mp3", "flac", "opus", "aac"]
AUDIO_FORMATS: tuple[str, ...] = AudioFormat.__args__


def _audio_bytes(value):
    # The reference reads a str of at most 255 characters as a file path on the server; here a str is
    # always the file's bytes in base64 (JSON cannot carry bytes), so an empty or short clip reaches the
    # audio checks and gets the answer a multipart upload of the same file gets.
    if isinstance(value, str):
        try:
            return pybase64.b64decode(value, validate=True)  # SIMD: ~60x the standard library's (a 10 s clip: 3 ms)
        except (binascii.Error, ValueError):
            pass
        try:  # what pybase64 refuses and the standard library accepts (extra trailing padding) stays accepted
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("reference audio is not valid base64: send the audio file's bytes base64-encoded "
                             "(a file path or URL is not read)") from None
    return value


# Audio file bytes: raw in msgpack and multipart, base64 in JSON.
AudioBytes = Annotated[bytes, BeforeValidator(_audio_bytes)]


class ReferenceAudio(BaseModel):
    audio: AudioBytes = Field(
        description="Audio file bytes (wav, mp3, flac, ...); base64 in JSON bodies."
    )
    text: str = Field(description="Transcript of the reference audio.")


def _range(bounds, description: str, **extra):
    low, high = bounds
    if isinstance(low, float):  # NaN fails every bound check, and was refused as "should be <= high"
        extra["allow_inf_nan"] = False
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


class Prosody(BaseModel):
    """Fish Audio's prosody: speed (pitch kept) and volume of the output."""

    speed: float = _range(SPEED_RANGE, "speed factor, pitch kept", default=1.0)
    volume: float = _range(VOLUME_DB_RANGE, "volume change in dB", default=0.0)


class OutputFields(BaseModel):
    """How the audio is delivered (Fish Audio's TTS request fields)."""

    sample_rate: int | None = Field(
        default=None, ge=SAMPLE_RATE_RANGE[0], le=SAMPLE_RATE_RANGE[1],
        description="Output sample rate in Hz (resampled); none = 44100 (48000 for opus).",
    )
    prosody: Prosody | None = Field(default=None, description="Speed and volume of the output.")
    latency: Literal["normal", "balanced"] = Field(
        default="normal",
        description="Accepted for compatibility with Fish Audio clients: this server streams the same way in both.",
    )

    def output_spec(self, fmt: str) -> OutputSpec:
        prosody = self.prosody or Prosody()
        return OutputSpec(fmt, self.sample_rate, prosody.speed, prosody.volume)


class TTSRequest(SamplingFields, VoiceFields, OutputFields):
    text: str = Field(description="Text to speak.")
    streaming: bool = Field(
        default=False,
        description="Send audio as it is produced (every format). Requests from Fish Audio SDKs (a `model` "
        "header) stream unless this is false.",
    )


class BatchTTSRequest(SamplingFields, VoiceFields):
    texts: list[str] = Field(min_length=1, description="Texts to speak, one audio file each, same voice.")


class VoiceId(BaseModel):
    id: str = Field(description="A saved voice id.")


class SpeechRequest(SamplingFields):
    """OpenAI's POST /v1/audio/speech. The sampling fields of /v1/tts, `references`, `reference_id` and
    `sample_rate` are accepted too (OpenAI SDKs send them through `extra_body`)."""

    model: str = Field(default="s1-mini", description="A model id from GET /v1/models.")
    input: str = Field(description="Text to speak.")
    voice: str | VoiceId | None = Field(
        default="default",
        description="A saved voice id, {\"id\": saved voice id}, or an OpenAI voice name (the voice it is mapped "
        "to with --openai-voices, else the model's own voice). Null or \"\" means \"default\", as an empty "
        "reference_id does on /v1/tts.",
    )
    instructions: str | None = Field(
        default=None,
        description="Not supported: S1-mini takes tone and emotion from markers in the text, e.g. (excited). "
        "A non-empty value is refused with 400.",
    )
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = Field(
        default="mp3", description="pcm is raw 16-bit little-endian mono at 24 kHz, as OpenAI's."
    )
    speed: float = _range(SPEED_RANGE, "speed factor, pitch kept", default=1.0)
    stream_format: Literal["audio", "sse"] = Field(
        default="audio",
        description="audio: the audio bytes as they are produced; sse: server-sent events speech.audio.delta "
        "(base64 audio) and speech.audio.done (usage).",
    )
    stream: bool = Field(default=True, description="Accepted for compatibility: responses always stream.")
    sample_rate: int | None = Field(
        default=None, ge=SAMPLE_RATE_RANGE[0], le=SAMPLE_RATE_RANGE[1],
        description="Output sample rate in Hz; none = 24000 for pcm, 44100 otherwise (48000 for opus).",
    )
    references: list[ReferenceAudio] = Field(
        default_factory=list,
        description="Inline reference clips to clone (then `voice` must be an OpenAI voice name, not a saved voice).",
    )
    reference_id: str | None = Field(default=None, description="A saved voice id, instead of `voice`.")


class RenameReferenceRequest(BaseModel):
    old_reference_id: str
    new_reference_id: str


class AddReferenceRequest(BaseModel):
    """fish-speech's /v1/references/add body (as JSON or msgpack; multipart sends the same fields)."""

    id: str = Field(description="Voice id: letters, digits, space, - and _")
    audio: AudioBytes = Field(description="Reference audio file bytes (base64 in JSON).")
    text: str = Field(description="Transcript of the reference audio.")


class DeleteReferenceRequest(BaseModel):
    reference_id: str
