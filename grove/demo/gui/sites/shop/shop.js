var PRODUCTS = {
  lamp: {name: "Desk lamp", price: 24},
  mug: {name: "Coffee mug", price: 9},
  chair: {name: "Office chair", price: 129},
  plant: {name: "Fern in a pot", price: 15}
};
function cart() { try { return JSON.parse(localStorage.getItem("cart") || "{}"); } catch (e) { return {}; } }
function saveCart(c) { localStorage.setItem("cart", JSON.stringify(c)); showCount(); }
function showCount() {
  var n = 0, c = cart();
  for (var k in c) n += c[k];
  var el = document.getElementById("cart-link");
  if (el) el.textContent = "Cart (" + n + ")";
}
document.addEventListener("DOMContentLoaded", showCount);
