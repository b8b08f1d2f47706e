"""Text games: maze, Sokoban, Gymnasium toy text (frozen lake, blackjack), Wordle, tic-tac-toe, Countdown."""
