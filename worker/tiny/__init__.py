"""The tiny models and their training: nothing here is on the data plane's path.

`model` generates the embedded random LingBot-World checkpoint (`tiny-lingbot-world`, the tests' model),
`dreamzero` the random DreamZero one (`tiny-dreamzero`); the family modules (`ardiff.worker.families`) import
them lazily. `world` is the yaw-only ray-cast world the trained tiny model learned, and `world_train`
(`ardiff worker train-tiny-world`) trains it: its data (`world_data`), the VAE stage (`world_vae`) and the
DiT stages, with what the stages share in `training`. The shipped result is `worker/models/tiny-world-trained`
(package data of `ardiff.worker`, found by `ardiff.worker.settings`).
"""
