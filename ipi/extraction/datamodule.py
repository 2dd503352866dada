"""LightningDataModule streaming replayed rows (rendered and tokenised on the fly).

Extraction streams *step groups*: all rows of one (trajectory, step, surface) that the cache still
lacks. The rows of a group are forwarded together, and each distinct screenshot of the group is
processed and encoded by the vision tower once (the clean screenshot is shared by every ``i_dom``
and ``i_tool`` variant; each ``i_vis`` variant has its own banner). :class:`ReplayDataset` (one
row per item, the processor's own call) is kept as the reference path for tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from itertools import groupby

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ipi.extraction.rows import ReplayRow
from ipi.interrupt import ignore_stop_signals
from ipi.protocol import TOKEN_GROUPS
from ipi.replay import tokenise


class ReplayDataset(Dataset):
    """Rows rendered (banner drawn for ``i_vis``) and tokenised lazily.

    Args:
        rows: Rows to replay.
        processor: The backbone's processor / tokenizer.
        system_prompt: System prompt of the agent.
        multimodal: Whether the screenshot is part of the prompt.
        image_size: Pixel limits for the image processor.
        image_token_id: Id of the image placeholder token.
    """

    def __init__(self, rows: Sequence[ReplayRow], processor, system_prompt: str, multimodal: bool,
                 image_size: dict | None, image_token_id: int | None):
        self.rows = list(rows)
        self.processor = processor
        self.system_prompt = system_prompt
        self.multimodal = multimodal
        self.image_size = image_size
        self.image_token_id = image_token_id

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        image = row.variant.image(row.step) if self.multimodal else None
        try:
            tok = tokenise(self.processor, row.parts(self.system_prompt, self.multimodal), image,
                           image_size=self.image_size, image_token_id=self.image_token_id)
        except ValueError as e:
            raise ValueError(f"row {row.row_id} (screenshot {row.step.screenshot}): {e}") from e
        return {"index": i, "row_id": row.row_id, "tok": tok}


def process_image(processor, image, image_size: dict | None) -> dict:
    """Run the image processor once on one screenshot.

    Args:
        processor: A Qwen2.5-VL processor.
        image: PIL image.
        image_size: Pixel limits (``size`` of the image processor), or ``None``.

    Returns:
        ``{"pixel_values": [patches, C*p*p], "image_grid_thw": [1, 3]}`` — what the processor's
        own ``__call__`` returns for this image.
    """
    out = processor.image_processor(images=[image], return_tensors="pt",
                                    **({"size": image_size} if image_size else {}))
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def step_groups(rows: Sequence[ReplayRow]) -> list[list[int]]:
    """Indices of ``rows`` grouped by (trajectory, step, surface), keeping row order.

    Rows of a group are consecutive in :func:`ipi.extraction.rows.build_rows` order; a group that
    reappears later (unsorted input) starts a new group, which is still correct, only slower.
    """
    key = lambda i: (rows[i].trajectory_id, rows[i].step.step, rows[i].variant.surface)
    return [list(g) for _, g in groupby(range(len(rows)), key=key)]


def _image_key(row: ReplayRow) -> tuple:
    # Variants whose prompt shows the unaltered screenshot share one encoding (Variant.image).
    v = row.variant
    if v.banner is None or v.variant == "clean":
        return ("screenshot", row.step.screenshot)
    return ("banner", v.variant, v.attack_index, v.banner, v.injected_text)


class StepGroupDataset(ReplayDataset):
    """Step groups (all rows of one trajectory step on one surface), tokenised lazily.

    Each screenshot of a group is decoded once, each distinct (bannered) image rendered and
    processed once; every row is tokenised against the shared image inputs
    (:func:`ipi.replay.tokenise` with ``image_inputs``), and the text stretches the rows share
    (all but the one holding the injected field) are tokenised once per group (``memo``).
    Arguments as :class:`ReplayDataset`; items are step groups instead of rows.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups = step_groups(self.rows)

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, g: int) -> dict:
        images: dict[tuple, int] = {}
        image_inputs: list[dict] = []
        items = []
        decoded: dict[str, object] = {}  # the step's screenshot, decoded once for all its variants
        memo: dict[str, tuple] = {}  # text stretches the variants share, tokenised once per step
        for i in self.groups[g]:
            row = self.rows[i]
            try:
                shared = None
                if self.multimodal:
                    key = _image_key(row)
                    if key not in images:
                        from ipi.data.images import load_rgb

                        path = row.step.screenshot
                        if path not in decoded:
                            decoded[path] = load_rgb(path, row.step.step)
                        images[key] = len(image_inputs)
                        image_inputs.append(process_image(
                            self.processor, row.variant.image(row.step, decoded[path]), self.image_size))
                    shared = image_inputs[images[key]]
                tok = tokenise(self.processor, row.parts(self.system_prompt, self.multimodal), None,
                               image_size=self.image_size, image_token_id=self.image_token_id,
                               image_inputs=shared, memo=memo)
            except ValueError as e:
                raise ValueError(f"row {row.row_id} (screenshot {row.step.screenshot}): {e}") from e
            tok.inputs.pop("pixel_values", None)  # held once per image below
            items.append({"index": i, "row_id": row.row_id, "tok": tok,
                          "image": images[key] if self.multimodal else None})
        return {"items": items, "images": image_inputs}


def collate_steps(groups: list[dict], pad_token_id: int) -> dict:
    """Collate step groups into one batch: rows right-padded, each distinct image once.

    Returns:
        As :func:`collate_rows`, except that ``inputs`` holds no ``pixel_values``; instead
        ``images = {"pixel_values": [P, D] of the distinct images, "image_grid_thw": [U, 3],
        "index_list": B ints (the distinct image each row shows)}`` (``None`` when text-only), and
        ``group_sizes`` (rows of each step group, in order: the unit of prefix reuse).
        Python lists (``index_list``, ``seq_len_list``, ``group_sizes``) stay on the host when Lightning moves the
        batch, so slicing never waits for the device.
    """
    items, pv, grids, index = [], [], [], []
    for grp in groups:
        base = len(grids)
        for im in grp["images"]:
            pv.append(im["pixel_values"])
            grids.append(im["image_grid_thw"])
        for it in grp["items"]:
            items.append(it)
            if it["image"] is not None:
                index.append(base + it["image"])
    batch = collate_rows(items, pad_token_id)
    batch["group_sizes"] = [len(grp["items"]) for grp in groups]
    batch["images"] = ({"pixel_values": torch.cat(pv), "image_grid_thw": torch.cat(grids),
                        "index_list": index} if grids else None)
    return batch


def collate_rows(items: list[dict], pad_token_id: int) -> dict:
    """Right-pad a list of tokenised rows into one batch.

    Returns:
        ``{"index": [B], "row_ids": list, "inputs": {input_ids [B, T], attention_mask [B, T],
        pixel_values [P, D]?, image_grid_thw [B, 3]?}, "groups": list of dicts,
        "prompt_len": [B], "seq_len": [B], "pool": [B, G, T], "prompt_mask": [B, T]}``;
        ``pool[b, g]`` holds ``1 / n`` on the ``n`` tokens of group ``g`` of row ``b`` (zeros for
        an empty group), so pooling is one batched matrix product on the device;
        ``prompt_mask[b]`` is 1 on the prompt tokens (the collapse statistic's tokens).
        ``mm_token_type_ids`` [B, T] is in ``inputs`` when rows show an image.
    """
    toks = [it["tok"] for it in items]
    T = max(t.seq_len for t in toks)
    B = len(toks)
    ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    pool = torch.zeros((B, len(TOKEN_GROUPS), T), dtype=torch.float32)
    prompt_mask = torch.zeros((B, T), dtype=torch.float32)
    for b, t in enumerate(toks):
        ids[b, : t.seq_len] = t.inputs["input_ids"][0]
        mask[b, : t.seq_len] = 1
        prompt_mask[b, : t.prompt_len] = 1.0
        for g, name in enumerate(TOKEN_GROUPS):
            idx = t.groups[name]
            if idx.numel():
                pool[b, g, idx] = 1.0 / idx.numel()
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "image_grid_thw" in toks[0].inputs:
        if "pixel_values" in toks[0].inputs:
            inputs["pixel_values"] = torch.cat([t.inputs["pixel_values"] for t in toks])
        inputs["image_grid_thw"] = torch.cat([t.inputs["image_grid_thw"] for t in toks])
        types = torch.zeros((B, T), dtype=torch.int32)
        for b, t in enumerate(toks):
            types[b, : t.seq_len] = t.inputs["mm_token_type_ids"][0]
        inputs["mm_token_type_ids"] = types
    return {
        "index": torch.tensor([it["index"] for it in items]),
        "row_ids": [it["row_id"] for it in items],
        "inputs": inputs,
        "groups": [t.groups for t in toks],
        "prompt_len": torch.tensor([t.prompt_len for t in toks]),
        "seq_len": torch.tensor([t.seq_len for t in toks]),
        "seq_len_list": [t.seq_len for t in toks],
        "pool": pool,
        "prompt_mask": prompt_mask,
    }


class ReplayDataModule(L.LightningDataModule):
    """Streams replay rows (or step groups) through ``Trainer.predict``.

    Args:
        dataset: A :class:`StepGroupDataset` (extraction) or a :class:`ReplayDataset` (one row
            per item), already filtered to the rows still missing from the cache.
        pad_token_id: Padding id for batching.
        batch_size: Items (step groups, or rows) per batch; not part of the cache key.
        num_workers: DataLoader workers rendering and tokenising ahead of the forward pass.
        prefetch_factor: Batches each worker prepares ahead (with ``num_workers > 0``).
    """

    def __init__(self, dataset: Dataset, pad_token_id: int, batch_size: int = 1, num_workers: int = 0,
                 prefetch_factor: int = 4):
        super().__init__()
        self.dataset = dataset
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor

    def predict_dataloader(self) -> DataLoader:
        collate = collate_steps if isinstance(self.dataset, StepGroupDataset) else collate_rows
        return DataLoader(
            self.dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
            collate_fn=partial(collate, pad_token_id=self.pad_token_id),
            persistent_workers=False, pin_memory=torch.cuda.is_available(),
            worker_init_fn=ignore_stop_signals if self.num_workers > 0 else None,  # Ctrl-C: the main process stops
            prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
        )
