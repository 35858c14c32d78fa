"""Comparing codec codes where the order of floating-point sums may tip a VQ decision."""

import torch

NEAR_TIE = 1e-4  # a VQ decision this close can go either way with the order of fp32 sums


def vq_margins(codec, audio: torch.Tensor) -> torch.Tensor:
    """(num_codebooks, T): how far each code of codec.encode(audio) (B = 1) won its VQ stage by, the
    gap between the best and the second-best score (as VectorQuantize.quantize scores entries)."""
    q = codec.quantizer
    audio = torch.nn.functional.pad(audio, (0, -audio.shape[-1] % codec.config.frame_length))
    residual = q.pre_module(q.downsample(codec.encoder(audio)))
    margins = []
    for vq in [*q.semantic_quantizer.quantizers, *q.quantizer.quantizers]:
        z_e = vq.in_proj(residual)
        e = torch.nn.functional.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]).float())
        c = torch.nn.functional.normalize(vq.codebook.weight.float())
        score = -(e.pow(2).sum(1, keepdim=True) - 2 * e @ c.t() + c.pow(2).sum(1, keepdim=True).t())
        top2 = score.topk(2, dim=1).values
        margins.append(top2[:, 0] - top2[:, 1])
        # The semantic stage's output comes off the latent, each residual stage's off what is left.
        residual = residual - vq.quantize(residual)[0]
    return torch.stack(margins)


def assert_same_codes_but_near_ties(codes: torch.Tensor, expected: torch.Tensor, margins: torch.Tensor,
                                    tie: float) -> None:
    """codes (num_codebooks, T) equal `expected` in every frame, except frames whose first
    differing codebook was a near tie (margin below `tie`, see vq_margins); the codebooks after it
    in that frame follow from it."""
    assert codes.shape == expected.shape
    for frame in (codes != expected).any(0).nonzero().flatten().tolist():
        first = int((codes[:, frame] != expected[:, frame]).nonzero()[0])
        assert margins[first, frame] < tie, (frame, first, float(margins[first, frame]))
