#!/usr/bin/env python3
"""A plain PyTorch speech-style training that knows nothing of crashcap: a GRU over feature frames
of 20 to 29 steps, trained with the CTC loss on transcripts of 3 to 7 symbols. The batch is the CTC
way: frames padded to the batch's longest, the frames' lengths, every transcript of the batch
concatenated into one tensor, and the transcripts' lengths. Adam, DataLoader workers; the loop
raises on a non-finite loss.

  --long-transcript K      sample K's transcript is longer than its frames: no alignment exists,
                           and the CTC loss is inf
  --repeated-transcript K  sample K's transcript is one symbol said two frames fewer times than it
                           has frames: shorter than its frames, but a blank must part each repeat,
                           so no alignment exists either
  --lists padded           the collate gives the lengths as Python lists and the transcripts padded
                           to the batch's longest, as many CTC trainings do
  --lists concatenated     the lengths as Python lists beside the transcripts concatenated
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SYMBOLS = 12  # 0 is the blank


class Utterances(Dataset):
    def __init__(self, long_transcript, repeated_transcript):
        self.long_transcript, self.repeated_transcript = long_transcript, repeated_transcript

    def __len__(self):
        return 300

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        frames = torch.randn(20 + i % 10, 8, generator=g)
        if i == self.repeated_transcript:
            return frames, torch.full((len(frames) - 2,), 5)
        length = len(frames) + 4 if i == self.long_transcript else 3 + i % 5
        return frames, torch.randint(1, SYMBOLS, (length,), generator=g)


def collate(items):
    frames = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return (frames, torch.tensor([len(x) for x, _ in items]), torch.cat([y for _, y in items]),
            torch.tensor([len(y) for _, y in items]))


def collate_lists_padded(items):
    frames = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return (frames, [len(x) for x, _ in items], nn.utils.rnn.pad_sequence([y for _, y in items], batch_first=True),
            [len(y) for _, y in items])


def collate_lists_concatenated(items):
    frames = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return frames, [len(x) for x, _ in items], torch.cat([y for _, y in items]), [len(y) for _, y in items]


class Recognizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 32, batch_first=True)
        self.out = nn.Linear(32, SYMBOLS)

    def forward(self, frames):
        return self.out(self.rnn(frames)[0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--long-transcript", type=int, default=-1)
    p.add_argument("--repeated-transcript", type=int, default=-1)
    p.add_argument("--lists", choices=["padded", "concatenated"])
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    model = Recognizer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctc = nn.CTCLoss(blank=0)
    loader = DataLoader(Utterances(a.long_transcript, a.repeated_transcript), batch_size=12, shuffle=True, num_workers=2,
                        collate_fn={None: collate, "padded": collate_lists_padded,
                                                "concatenated": collate_lists_concatenated}[a.lists])
    for epoch in range(a.epochs):
        for frames, frame_lengths, transcripts, transcript_lengths in loader:
            log_probs = F.log_softmax(model(frames), -1).transpose(0, 1)
            loss = ctc(log_probs, transcripts, frame_lengths, transcript_lengths)
            if not torch.isfinite(loss):
                raise RuntimeError(f"non-finite CTC loss {loss.item()}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
