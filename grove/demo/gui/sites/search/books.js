var BOOKS = [
  {id: 1, title: "A Wizard of Earthsea", author: "Ursula K. Le Guin"},
  {id: 2, title: "Left Hand Path", author: "J. Doe"},
  {id: 3, title: "The Dispossessed", author: "Ursula K. Le Guin"},
  {id: 4, title: "Right Hand Man", author: "A. Smith"},
  {id: 5, title: "Kindred", author: "Octavia E. Butler"},
  {id: 6, title: "The Left Hand of God", author: "P. Hoffman"},
  {id: 7, title: "The Left Hand of Darkness", author: "Ursula K. Le Guin"},
  {id: 8, title: "Parable of the Sower", author: "Octavia E. Butler"},
  {id: 9, title: "Dune", author: "Frank Herbert"},
  {id: 10, title: "Hand in Hand", author: "B. Jones"},
  {id: 11, title: "Solaris", author: "Stanislaw Lem"}
];
