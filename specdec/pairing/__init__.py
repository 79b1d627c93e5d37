"""`--drafter auto`: the drafters a target could use on this machine, each measured against the target's own
decoding, and the one that pays kept (or lookup alone)."""
