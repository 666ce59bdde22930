"""The embedded tiny models: nothing here is on the data plane's path.

`model` generates the embedded random LingBot-World checkpoint (`tiny-lingbot-world`, the tests' model),
`dreamzero` the random DreamZero one (`tiny-dreamzero`); the family modules (`ardiff.worker.families`) import
them lazily. The trained tiny world (`worker/models/tiny-world-trained`, package data of `ardiff.worker`,
found by `ardiff.worker.settings`) was trained by `ardiff.tiny_world`, which is not shipped.
"""
