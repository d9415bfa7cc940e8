from .cli import main

if __name__ == "__main__":  # not when a spawned process (vLLM's engine core) imports the main module again
    main()
