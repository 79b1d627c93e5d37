"""The round's math and types, below the engine and the drafters: what a draft and a verification are
(rounds), the acceptance rules (verify), sampling settings and distributions (sampling), the commit step
(commit), token trees (tree), seeded randomness (randomness), how many tokens to draft (speculation_length,
batch_drafts), statistics (stats) and the speedup theory (analysis). Nothing here imports a drafter, a model
loader or anything above the engine."""
