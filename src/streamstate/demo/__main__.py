from streamstate.demo import main

main()
