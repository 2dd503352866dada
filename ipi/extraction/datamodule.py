"""LightningDataModule streaming replayed rows (rendered and tokenised on the fly)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ipi.extraction.rows import ReplayRow
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


def collate_rows(items: list[dict], pad_token_id: int) -> dict:
    """Right-pad a list of tokenised rows into one batch.

    Returns:
        ``{"index": [B], "row_ids": list, "inputs": {input_ids [B, T], attention_mask [B, T],
        pixel_values [P, D]?, image_grid_thw [B, 3]?}, "groups": list of dicts,
        "prompt_len": [B], "seq_len": [B]}``.
    """
    toks = [it["tok"] for it in items]
    T = max(t.seq_len for t in toks)
    B = len(toks)
    ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    for b, t in enumerate(toks):
        ids[b, : t.seq_len] = t.inputs["input_ids"][0]
        mask[b, : t.seq_len] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "pixel_values" in toks[0].inputs:
        inputs["pixel_values"] = torch.cat([t.inputs["pixel_values"] for t in toks])
        inputs["image_grid_thw"] = torch.cat([t.inputs["image_grid_thw"] for t in toks])
    return {
        "index": torch.tensor([it["index"] for it in items]),
        "row_ids": [it["row_id"] for it in items],
        "inputs": inputs,
        "groups": [t.groups for t in toks],
        "prompt_len": torch.tensor([t.prompt_len for t in toks]),
        "seq_len": torch.tensor([t.seq_len for t in toks]),
    }


class ReplayDataModule(L.LightningDataModule):
    """Streams replay rows through ``Trainer.predict``.

    Args:
        dataset: The rows to replay (already filtered to the rows still missing from the cache).
        pad_token_id: Padding id for batching.
        batch_size: Rows per forward pass (device-dependent; not part of the cache key).
        num_workers: DataLoader workers rendering and tokenising ahead of the forward pass.
    """

    def __init__(self, dataset: ReplayDataset, pad_token_id: int, batch_size: int = 1, num_workers: int = 0):
        super().__init__()
        self.dataset = dataset
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.num_workers = num_workers

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(
            self.dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
            collate_fn=partial(collate_rows, pad_token_id=self.pad_token_id),
            persistent_workers=False, pin_memory=torch.cuda.is_available(),
        )
