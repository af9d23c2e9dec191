"""The model and its copies: the policy and its adapters, the explore and rollout copies, the sampler, sharding and
checkpoints."""
