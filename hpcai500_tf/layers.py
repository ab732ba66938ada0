"""The nine layers of HPC AI500's methodology: their ids, and the key each has in a record
(a leaf: records, configs and scoring all name layers)."""

LAYER_KEYS = {
    "L1": "hardware",
    "L2": "os",
    "L3": "communication",
    "L4": "accelerator_libraries",
    "L5": "framework",
    "L6": "programming_model",
    "L7": "workload",
    "L8": "hyperparameters",
    "L9": "problem",
}
LAYER_IDS = tuple(LAYER_KEYS)
