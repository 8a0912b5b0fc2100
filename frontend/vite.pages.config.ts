import { defineConfig } from 'vite';

// The server-rendered pages' own script (dist/pages.js + pages.css): a shared
// conversation's markdown rendered as the chat renders it (loaded only on that page), the
// copy button of the API keys page. Built after the chat UI into the same dist/.
export default defineConfig({
  base: '/static/',
  publicDir: false,
  build: {
    outDir: 'dist',
    emptyOutDir: false,
    target: 'es2020',
    cssCodeSplit: false,
    sourcemap: false,
    modulePreload: false,
    // Fonts as files, never inlined as data: URLs (the page's CSP takes fonts from 'self' only).
    assetsInlineLimit: 0,
    rolldownOptions: {
      input: 'src/pages/main.ts',
      output: {
        format: 'es',
        entryFileNames: 'pages.js',
        chunkFileNames: 'assets/pages-[name]-[hash].js',
        assetFileNames: (info) =>
          (info.names || [info.name || '']).some((n) => n && n.endsWith('.css'))
            ? 'pages.css'
            : 'assets/[name]-[hash][extname]',
      },
    },
  },
});
