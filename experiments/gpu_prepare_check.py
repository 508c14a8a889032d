"""One-off device check: the profiler changes nothing in torch once guard.install() ran."""

# on the device: does guard.install() leave torch as a later profiler start finds it?
import torch

from kernelbrain.child import guard, launches

guard.install()
before = guard.torch_identities()
launches.check_launches(lambda: torch.ones(4, device="cuda"), set(), require_own=False)
print("moved after a profile:", guard.moved(before, guard.torch_identities()))
