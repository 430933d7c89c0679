# vLLM's offline example examples/offline_inference/basic/embed.py (Apache-2.0), run by miro: the imports and the
# argument parser differ (vLLM's EngineArgs.add_cli_args becomes --model and --runner), the model is a miro alias.

import argparse

from miro import LLM


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--runner", default="pooling")
    parser.set_defaults(enforce_eager=True)
    return parser.parse_args()


def main(args: argparse.Namespace):
    # Sample prompts.
    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]

    # Create an LLM.
    # You should pass runner="pooling" for embedding models
    llm = LLM(**vars(args))

    # Generate embedding. The output is a list of EmbeddingRequestOutputs.
    outputs = llm.embed(prompts)

    # Print the outputs.
    print("\nGenerated Outputs:\n" + "-" * 60)
    for prompt, output in zip(prompts, outputs):
        embeds = output.outputs.embedding
        embeds_trimmed = (str(embeds[:16])[:-1] + ", ...]") if len(embeds) > 16 else embeds
        print(f"Prompt: {prompt!r} \nEmbeddings: {embeds_trimmed} (size={len(embeds)})")
        print("-" * 60)


if __name__ == "__main__":
    args = parse_args()
    main(args)
