"""The tiny world and the training of the checkpoint the worker ships (`worker/models/tiny-world-trained`).

Dev harness, like `ardiff.devcluster`: it runs from a checkout and is in no distribution or image. `world` is
the yaw-only ray-cast world the trained tiny model learned (also the world-quality benchmark's ground
truth); `train` (`ardiff train-tiny-world`) trains it: its data (`data`), the VAE stage (`vae`) and the DiT
stages, with what the stages share in `stages`.
"""
