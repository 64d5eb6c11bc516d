"""QAvg / PAvg in the Flower app: the problem both sides build, the clients' local updates, the method."""
