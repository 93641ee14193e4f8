from memci_proxy.emulator.cli import main

if __name__ == "__main__":
    main()
