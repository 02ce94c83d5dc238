"""The Lightning training layer: one Trainer builder shared by every stage that trains (drafters, target,
heads, router). Above `core`, below the components' LightningModules and the pipeline stages."""
