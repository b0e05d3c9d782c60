"""The data of each task (trainer/tasks.py picks them): `text` (documents from local files, a generated corpus,
causal-LM token blocks), `mlm` (the masked-LM preparation: WordPiece, samples, static masking, shards) and
`shards` (reading them back), `images` (an image folder or synthetic images), `sampler` (a seeded order whose
position is a checkpoint's)."""
