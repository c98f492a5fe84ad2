"""The trainer's fused AdamW takes the same steps as torch's default AdamW (the reference loop)."""

import copy

import torch

from rftflow.components.train.optim import adamw, cosine


def test_fused_adamw_matches_the_default_adamw_over_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    fused_model, reference_model = copy.deepcopy(model), copy.deepcopy(model)
    fused = adamw(fused_model.parameters(), 1e-2, 0.1)
    reference = torch.optim.AdamW(reference_model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        for m, optimizer in ((fused_model, fused), (reference_model, reference)):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            optimizer.step()
    for a, b, start in zip(fused_model.parameters(), reference_model.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert (a - start).abs().min() > 1e-3  # every weight took the steps
        assert a._version >= 5  # each step marked in place, as the loop's ops mark it (caches key on it)


def test_cosine_runs_from_start_to_end():
    assert cosine(1.0, 0.1, 0.0) == 1.0 and cosine(1.0, 0.1, 1.0) == 0.1
    assert abs(cosine(1.0, 0.1, 0.5) - 0.55) < 1e-12
