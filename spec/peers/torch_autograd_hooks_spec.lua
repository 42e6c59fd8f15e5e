-- The saved_tensors_hooks and checkpoint cases of PyTorch's test/test_autograd.py:
-- NOT PORTED YET. The PyTorch repository snapshot is larger than the session
-- could bring in (4 GB), and the stored index did not yield test_autograd.py's
-- hook cases in the time this port had. This file keeps the gap visible in the
-- spec run; spec/20-saved_hooks_spec.lua covers moongrad's own hooks.
describe("test/test_autograd.py saved_tensors_hooks and checkpoint cases", function()
  pending("not ported yet: the saved_tensors_hooks cases of test/test_autograd.py " ..
          "(TestAutograd.test_saved_tensors_hook_*, test_default_saved_tensors_hooks_*)")
  pending("not ported yet: the checkpoint cases of test/test_autograd.py " ..
          "(test_checkpointing*, TestAutogradNonReentrantCheckpoint)")
end)
