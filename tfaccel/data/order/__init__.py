"""Order and resume: one global order by index, seeded augmentations, partial batches."""
