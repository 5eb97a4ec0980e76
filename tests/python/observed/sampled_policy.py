"""An unmodified REINFORCE-style training: actions are drawn from the policy's softmax with
torch.multinomial and their log-probabilities weighted by the returns. Knows nothing of crashcap.

--nan-index I puts a NaN into dataset sample I's observation: the softmax goes NaN and
torch.multinomial raises "probability tensor contains either inf, nan or element < 0", an error
about a NaN another op made."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Episodes(Dataset):
    def __init__(self, n, nan_index):
        g = torch.Generator().manual_seed(0)
        self.obs = torch.randn(n, 6, generator=g)
        self.ret = torch.randn(n, generator=g)
        if nan_index >= 0:
            self.obs[nan_index, 3] = float("nan")

    def __len__(self):
        return len(self.obs)

    def __getitem__(self, i):
        return self.obs[i], self.ret[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nan-index", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(1)
    policy = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.RMSprop(policy.parameters(), lr=1e-3)
    loader = DataLoader(Episodes(400, args.nan_index), batch_size=16, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(5))
    for epoch in range(args.epochs):
        for obs, ret in loader:
            probs = torch.softmax(policy(obs), dim=1)
            act = torch.multinomial(probs, 1).squeeze(1)
            logp = torch.log(probs.gather(1, act[:, None]).squeeze(1))
            loss = -(logp * ret).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
