"""The architectures tracengine runs (registry.py: Llama, Mistral, Qwen2,
Qwen3, Qwen3-MoE) in plain torch, their layers and attention, a loader for
Hugging Face checkpoints, and the embedded tiny model. Importing this
package does not import torch: the engine and the CLI can name the embedded
model without loading a framework."""
import os

EMBEDDED_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded")
