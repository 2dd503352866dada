"""Constructed backbones with a planted, known answer (docs/selftest.md, "Known answers").

A constructed backbone is the tiny Qwen2.5-VL architecture
(:func:`ipi.backbone.build_tiny_qwen2_5_vl`) with a *plant* (``semantic``, ``lexical`` or
``surface``) written into its weights, so the verdict it must reach is known before the run.
:func:`plant_reaches_layers` measures that the plant is still there at the probed blocks; the
random-weight twin is the architecture without the plant (:func:`ipi.run.twin.twin_config`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from ipi.backbone import Backbone

__all__ = ["PLANT_KEYS", "PLANT_KINDS", "build_planted", "lexical_token_ids", "match_mean_alignment",
           "mean_states", "plant_directions",
           "plant_reaches_layers", "semantic_token_ids", "wrapper_token_ids"]

PLANT_KINDS = ("semantic", "lexical", "surface")
#: The keys of ``backbone.loader.plant`` (:func:`build_planted`).
PLANT_KEYS = ("kind", "gain", "seed", "words", "wrappers", "vision_gain", "share", "orthogonal_to_mean_state",
              "mean_state_through_block", "match_mean_alignment_through_block")


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _forms(word: str) -> list[str]:
    """Spellings of ``word`` as it appears in running text and inside URLs."""
    out = []
    for w in dict.fromkeys([word, word.lower(), word.capitalize(), word.upper()]):
        out += [w, " " + w, "-" + w, "/" + w, "." + w]
    return out


def benign_token_ids(tok) -> set[int]:
    """Every token of the benign banks (``c_imperative`` texts and their padding sentences)."""
    from ipi.surfaces.bank import BENIGN_IMPERATIVES, NEUTRAL_SENTENCES

    out: set[int] = set()
    for t in (*BENIGN_IMPERATIVES, *NEUTRAL_SENTENCES):
        out |= set(_ids(tok, t)) | set(_ids(tok, " " + t))
    return out


def semantic_token_ids(tok, words: Iterable[str]) -> list[int]:
    """Tokens of the goal lexicon: each spelling of each word that is ONE token, minus benign tokens.

    Args:
        tok: The tokenizer.
        words: The lexicon (``plant.words``).

    Returns:
        Sorted token ids.
    """
    ids: set[int] = set()
    for w in words:
        for f in _forms(str(w)):
            t = _ids(tok, f)
            if len(t) == 1:
                ids.add(t[0])
    return sorted(ids - benign_token_ids(tok))


def _bank_entries() -> list[str]:
    from ipi.surfaces.bank import ATTACK_GOAL_LIST, ATTACK_TEMPLATES

    return [t.replace("{goal}", "") for t in ATTACK_TEMPLATES] + [g for _, g in ATTACK_GOAL_LIST]


def lexical_token_ids(tok) -> list[int]:
    """Word tokens (3+ letters) that occur in exactly one entry of the attack bank (template or
    goal), minus benign tokens; each entry is tokenised after a space and on its own.
"""
    seen: dict[int, int] = {}
    for e in _bank_entries():
        for i in set(_ids(tok, e)) | set(_ids(tok, " " + e)):
            seen[i] = seen.get(i, 0) + 1
    words = {i for i, n in seen.items() if n == 1 and _is_word(tok.convert_ids_to_tokens(i))}
    return sorted(words - benign_token_ids(tok))


def _is_word(piece: str) -> bool:
    """A token that is a word of 3+ letters (optionally after the byte-level space ``Ġ``)."""
    w = piece[1:] if piece.startswith("\u0120") else piece
    return len(w) >= 3 and w.isalpha() and w.isascii()


def wrapper_token_ids(tok, wrappers: Iterable[str]) -> list[int]:
    """Tokens of the surfaces' wrappers that no attack, imperative or neutral text uses."""
    bank: set[int] = benign_token_ids(tok)
    for e in _bank_entries():
        bank |= set(_ids(tok, e)) | set(_ids(tok, " " + e))
    ids: set[int] = set()
    for w in wrappers:
        ids |= set(_ids(tok, str(w)))
    return sorted(ids - bank)


def plant_directions(kind: str, token_ids: Sequence[int], hidden: int, seed: int, share: float = 1.0) -> torch.Tensor:
    """Unit directions per planted token: ``[len(token_ids), hidden]`` float32.

    ``semantic`` and ``surface``: every token's direction has cosine ``share`` with one common
    direction ``u`` (the first row drawn), the rest an independent direction of its own orthogonal
    to ``u`` (``share = 1``: all equal ``u``); ``lexical``: one independent direction per token.
    Drawn from ``numpy.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(int(seed))
    n = len(token_ids)
    if kind == "lexical":
        v = rng.standard_normal((n, hidden))
    else:
        u = rng.standard_normal(hidden)
        u /= np.linalg.norm(u)
        v = np.repeat(u[None], n, axis=0)
        if share < 1.0:
            r = rng.standard_normal((n, hidden))
            r -= np.outer(r @ u, u)
            r /= np.linalg.norm(r, axis=1, keepdims=True)
            v = share * v + np.sqrt(1.0 - share ** 2) * r
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return torch.from_numpy(v.astype(np.float32))


def mean_states(backbone: Backbone, text: str) -> torch.Tensor:
    """The mean unit-normalised token state ``[L + 1, hidden]`` at the embeddings and at every
    decoder block of ``backbone`` over ``text`` (the collapse statistic's mean vector, PROTOCOL.md
    §3: its squared norm is the statistic)."""
    tok = backbone.tokenizer
    ids = torch.tensor([_ids(tok, text)])
    lm = getattr(backbone.model, "language_model", None) or backbone.model
    with torch.no_grad():
        hs = lm(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.stack([torch.nn.functional.normalize(h[0].float(), dim=-1).mean(dim=0) for h in hs])


def _orthonormal_basis(rows: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis ``[k, hidden]`` of the span of ``rows`` ``[n, hidden]`` (QR; k <= n)."""
    q, r = torch.linalg.qr(rows.T)  # [hidden, n]
    keep = r.diagonal().abs() > 1e-6 * r.diagonal().abs().max()
    return q[:, keep].T.contiguous()


def match_mean_alignment(dirs: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """Give unit directions orthogonal to ``means`` the alignment an ordinary token has with them.

    The collapse statistic is ``|m|²``, ``m`` the mean unit token state. A planted token whose
    direction is orthogonal to ``m_b`` shrinks it by ``((T - k) / T)²`` for ``k`` planted tokens
    of ``T``, a first-order shift the collapse-only probe reads as "attack". Each returned
    direction is ``s + sqrt(1 - |s|²) · d``, with ``s`` the least-norm vector in the span of
    ``means`` with ``s · m_b / |m_b| = |m_b|`` at every block ``b``; the statistic then moves
    only at second order (``(k / T)²``).

    Args:
        dirs: ``[n, hidden]`` unit directions orthogonal to the rows of ``means``.
        means: ``[L + 1, hidden]`` mean unit token states (:func:`mean_states`).

    Returns:
        ``[n, hidden]`` unit directions.

    Raises:
        ValueError: No unit vector has these alignments (``|s| >= 1``).
"""
    norms = means.norm(dim=1)
    s = torch.linalg.pinv(means / norms[:, None]) @ norms  # [hidden], least-norm solution
    if float(s.norm()) >= 1.0:
        raise ValueError(f"match_mean_alignment: the mean states' alignments need |s| = {float(s.norm()):.3f} >= 1")
    return s[None] + torch.sqrt(1.0 - s.dot(s)) * dirs


def _orthogonal_to(dirs: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Rows of ``dirs`` projected orthogonal to the rows of ``basis`` (orthonormal), re-normalised."""
    out = dirs - (dirs @ basis.T) @ basis
    return torch.nn.functional.normalize(out, dim=-1)


def _input_embeddings(model) -> torch.nn.Embedding:
    emb = model.get_input_embeddings()
    if not isinstance(emb, torch.nn.Embedding):
        raise ValueError(f"{type(model).__name__}: no input embedding matrix to plant on")
    return emb


def _plant_patch_darkness(model, gain: float, seed: int) -> None:
    """Add ``gain * v * (-mean normalised pixel of the patch)`` to every vision patch embedding."""
    visual = getattr(model, "visual", None) or getattr(getattr(model, "model", None), "visual", None)
    if visual is None:
        raise ValueError(f"{type(model).__name__}: no vision tower to plant the surface darkness on")
    w = visual.patch_embed.proj.weight  # [embed, 3, t, p, p]
    v = plant_directions("surface", [0], w.shape[0], seed + 1)[0].to(w.dtype)
    with torch.no_grad():
        w += (-float(gain) / w[0].numel()) * v.view(-1, 1, 1, 1, 1).expand_as(w)


def build_planted(base, plant: dict, *, name: str = "planted", random_init_seed: int | None = None,
                             max_layer: int | None = None, with_lm_head: bool = False) -> Backbone:
    """The tiny Qwen2.5-VL of ``base`` with ``plant`` written into its weights (docs/selftest.md, "Known answers").

    Args:
        base: The ``backbone.loader`` node of the architecture (a ``_target_`` node of
            :func:`ipi.backbone.build_tiny_qwen2_5_vl`; instantiated here, ``_recursive_: false``).
        plant: ``{"kind": semantic|lexical|surface, "gain": float, "seed": int, "words": [...]
            (semantic), "wrappers": [...] and "vision_gain" (surface), "share": float (cosine of
            each direction with the common one, :func:`plant_directions`),
            "orthogonal_to_mean_state": bool with "mean_state_through_block": int (directions
            orthogonal to the unplanted architecture's mean token states at the embeddings and blocks
            ``0..k``, measured on it built to block ``k``, whatever depth this call builds),
            "match_mean_alignment_through_block": int | None (:func:`match_mean_alignment` on the
            embeddings and blocks ``0..k``, ``k`` at most ``mean_state_through_block``)}``.
        name: Backbone name recorded in results.
        random_init_seed: Build the random-weight twin: the architecture with this seed and no
            plant (the same backbone :func:`ipi.run.twin.twin_config` builds from ``loader.base``).
        max_layer: Keep only decoder blocks ``0..max_layer``.
        with_lm_head: Build the class with the LM head.

    Returns:
        The frozen backbone; ``identity`` adds ``plant`` (kind, gain, seed, planted token count).

    Raises:
        ValueError: Unknown plant kind or key, a gain that is zero or not a number, a share outside
            [-1, 1], a plant that touches no token, ``orthogonal_to_mean_state`` without
            ``mean_state_through_block`` (or that past the architecture's blocks),
            ``match_mean_alignment_through_block`` without ``orthogonal_to_mean_state``, negative, or
            past ``mean_state_through_block``.
    """
    from hydra.utils import instantiate

    from ipi.backbone import build_kwargs

    kw = build_kwargs(base, max_layer=max_layer, with_lm_head=with_lm_head)
    if random_init_seed is not None:
        return instantiate(base, random_init_seed=int(random_init_seed), **kw)
    plant = dict(plant)
    kind = str(plant.get("kind"))
    if kind not in PLANT_KINDS:
        raise ValueError(f"backbone={name}: plant.kind={kind!r}; allowed: {', '.join(PLANT_KINDS)}")
    unknown = sorted(set(plant) - set(PLANT_KEYS))
    if unknown:  # a misspelt key would silently plant something else than the config says
        raise ValueError(f"backbone={name}: unknown plant key(s) {', '.join(unknown)}; allowed: {', '.join(PLANT_KEYS)}")
    gain = plant.get("gain")
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not np.isfinite(gain) or gain == 0:
        raise ValueError(f"backbone={name}: plant.gain={gain!r}; a finite non-zero number (0 plants nothing)")
    share = plant.get("share", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not -1.0 <= share <= 1.0:
        raise ValueError(f"backbone={name}: plant.share={share!r}; a cosine in [-1, 1]")
    through = plant.get("match_mean_alignment_through_block")
    if through is not None and (isinstance(through, bool) or not isinstance(through, int) or through < 0):
        raise ValueError(f"backbone={name}: plant.match_mean_alignment_through_block={through!r}; null or a decoder "
                         "block index >= 0")
    depth = plant.get("mean_state_through_block")
    if plant.get("orthogonal_to_mean_state", False):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"backbone={name}: plant.orthogonal_to_mean_state needs plant.mean_state_through_block, "
                             f"a decoder block index >= 0 (got {depth!r}): the mean states are measured at the "
                             "embeddings and blocks 0..k, the same whatever depth a run builds")
        if through is not None and through > depth:
            raise ValueError(f"backbone={name}: plant.match_mean_alignment_through_block={through} is past "
                             f"plant.mean_state_through_block={depth} (the blocks whose mean states are measured)")
    else:
        for key in ("mean_state_through_block", "match_mean_alignment_through_block"):
            if plant.get(key) is not None:
                raise ValueError(f"backbone={name}: plant.{key} needs plant.orthogonal_to_mean_state=true (it measures "
                                 "or aligns to the mean state the directions are drawn orthogonal to)")
    bb = instantiate(base, **kw)
    tok, seed = bb.tokenizer, int(plant.get("seed", 0))
    if kind == "semantic":
        ids = semantic_token_ids(tok, plant.get("words") or [])
    elif kind == "lexical":
        ids = lexical_token_ids(tok)
    else:
        ids = wrapper_token_ids(tok, plant.get("wrappers") or [])
    if not ids:
        raise ValueError(f"backbone={name}: the {kind} plant touches no token (plant.words / plant.wrappers)")
    emb = _input_embeddings(bb.model)
    dirs = plant_directions(kind, ids, emb.weight.shape[1], seed, float(plant.get("share", 1.0)))
    if plant.get("orthogonal_to_mean_state", False):
        from ipi.protocol import DEFAULT_SYSTEM_PROMPT

        # Orthogonal to the unplanted network's mean token state at the embeddings and blocks
        # 0..mean_state_through_block, measured on the architecture built to exactly that depth, so
        # the plant moves the probe's features, not the collapse statistic (probe check 5).
        reference = instantiate(base, **build_kwargs(base, max_layer=int(depth)))
        means = mean_states(reference, DEFAULT_SYSTEM_PROMPT)  # [depth + 2, hidden]
        dirs = _orthogonal_to(dirs, _orthonormal_basis(means))
        if through is not None:
            # ... then an ordinary token's cosine with it (docs/selftest.md, "Known answers")
            dirs = match_mean_alignment(dirs, means[: int(through) + 2])
    with torch.no_grad():
        emb.weight[torch.tensor(ids)] += float(plant["gain"]) * dirs.to(emb.weight.dtype)
    if kind == "surface" and float(plant.get("vision_gain") or 0.0):
        _plant_patch_darkness(bb.model, float(plant["vision_gain"]), seed)
    bb.name = name
    bb.identity = {**bb.identity, "constructed": True,
                   "plant": {"kind": kind, "gain": float(plant["gain"]), "seed": seed,
                             "tokens": len(ids)}}
    return bb


def plant_reaches_layers(backbone: Backbone, token_ids: Sequence[int], direction: torch.Tensor,
                         context: str, layers: Sequence[int]) -> dict[int, float]:
    """How much of the planted direction the residual stream keeps at each block.

    Forwards ``context`` + one planted token through the text decoder and returns, per block in
    ``layers``, the cosine between the planted token's hidden state (output of the block, before
    the final norm) and ``direction``.

    Args:
        backbone: A constructed backbone.
        token_ids: Planted token ids (the first is used).
        direction: Its planted unit direction ``[hidden]``.
        context: Text before the token.
        layers: Blocks to read.

    Returns:
        ``{block: cosine}``.
    """
    tok = backbone.tokenizer
    ids = torch.tensor([_ids(tok, context) + [int(token_ids[0])]])
    lm = getattr(backbone.model, "language_model", None) or backbone.model
    with torch.no_grad():
        out = lm(input_ids=ids, output_hidden_states=True)
    hs = out.hidden_states  # [embeddings, block 0, ..., last (normed)]
    d = direction / direction.norm()
    res = {}
    for k in layers:
        h = hs[int(k) + 1][0, -1]
        res[int(k)] = float(torch.dot(h, d) / h.norm())
    return res


def _planted_config(base, **_):
    """The architecture's config of :func:`build_planted`: its ``base`` node's (the plant changes no shape)."""
    from ipi.backbone import model_config

    return model_config(base)


build_planted.model_config = _planted_config
